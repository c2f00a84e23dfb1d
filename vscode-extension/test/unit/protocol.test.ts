import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  CLIENT_COMMANDS,
  SERVER_COMMANDS,
  SHOW_COMMANDS,
  isComparisonReport,
  languageForView,
  outputDocumentPath,
  presetsParams,
  runArguments,
  showRequest,
  viewTitle,
} from "../../src/protocol";

const source = "file:///work/main/examples/gpt2.linnet";

describe("showRequest", () => {
  it("asks linnet/showIR for the Core IR", () => {
    assert.deepEqual(showRequest({ kind: "ir" }, source, "gpt2"), {
      method: "linnet/showIR",
      params: { uri: source, preset: "gpt2" },
    });
  });

  it("asks linnet/showGenerated with the target", () => {
    for (const target of ["torch", "jax", "stablehlo", "onnx"] as const) {
      assert.deepEqual(showRequest({ kind: "generated", target }, source, ""), {
        method: "linnet/showGenerated",
        params: { uri: source, target, preset: null },
      });
    }
  });

  it("asks linnet/presets with the document", () => {
    assert.deepEqual(presetsParams(source), { uri: source });
  });

  it("runs an entry with the server's linnet.run argument", () => {
    assert.deepEqual(runArguments(source, "step", "onnxruntime", ""), {
      uri: source,
      entry: "step",
      backend: "onnxruntime",
      preset: null,
    });
    assert.equal(runArguments(source, "forward", "torch", "gpt2").preset, "gpt2");
  });
});

describe("commands", () => {
  it("has one show command per view, with the documented names", () => {
    assert.deepEqual(
      SHOW_COMMANDS.map((c) => c.command),
      ["linnet.showIR", "linnet.showGeneratedTorch", "linnet.showGeneratedJax", "linnet.showGeneratedStableHLO", "linnet.showGeneratedOnnx"],
    );
  });

  it("never registers a command the server registers through executeCommand", () => {
    for (const command of SERVER_COMMANDS) {
      assert.equal(CLIENT_COMMANDS.includes(command), false, command);
    }
    assert.equal(new Set(CLIENT_COMMANDS).size, CLIENT_COMMANDS.length);
  });
});

describe("comparison reports", () => {
  it("recognises the reports the server writes, and nothing else", () => {
    assert.equal(isComparisonReport("file:///home/me/.cache/linnet/reports/mlp-1a2b3c4d.forward.compare.md"), true);
    assert.equal(isComparisonReport("file:///tmp/linnet-1000/reports/llama-0f0f0f0f.step.compare.md"), true);
    assert.equal(isComparisonReport("file:///home/me/notes/forward.compare.md"), false);
    assert.equal(isComparisonReport("file:///home/me/.cache/linnet/reports/mlp.linnet"), false);
    assert.equal(isComparisonReport("untitled:reports/x.compare.md"), false);
  });
});

describe("output documents", () => {
  it("shows generated PyTorch and JAX as Python and the rest as plain text", () => {
    assert.equal(languageForView({ kind: "generated", target: "torch" }), "python");
    assert.equal(languageForView({ kind: "generated", target: "jax" }), "python");
    assert.equal(languageForView({ kind: "generated", target: "stablehlo" }), "plaintext");
    assert.equal(languageForView({ kind: "generated", target: "onnx" }), "plaintext");
    assert.equal(languageForView({ kind: "ir" }), "plaintext");
  });

  it("names the output after the source file and the view", () => {
    assert.equal(outputDocumentPath(source, { kind: "generated", target: "torch" }), "/gpt2.torch.py");
    assert.equal(outputDocumentPath(source, { kind: "ir" }), "/gpt2.ir.txt");
    assert.equal(outputDocumentPath("untitled:Untitled-1", { kind: "generated", target: "jax" }), "/untitled:Untitled-1.jax.py");
    assert.equal(
      outputDocumentPath("file:///c%3A/models/my%20net.linnet", { kind: "generated", target: "onnx" }),
      "/my net.onnx.txt",
    );
  });

  it("names a code view it has no table entry for after the server's target", () => {
    assert.equal(outputDocumentPath(source, { kind: "generated", target: "tflite" }), "/gpt2.tflite.txt");
    assert.equal(viewTitle({ kind: "generated", target: "tflite" }), "tflite");
    assert.equal(languageForView({ kind: "generated", target: "tflite" }), "plaintext");
  });
});
