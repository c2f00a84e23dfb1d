import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { backendPickItems, codeViewPickItems, entriesFromLenses } from "../../src/backends";
import { BackendInfo, parseBackends } from "../../src/protocol";

// What the server's `linnet/backends` answers (linnet/runtimes/backends/__init__.py `Backend.describe`), shortened.
const ANSWER = [
  { name: "torch-interpret", label: "PyTorch (interpreter)", family: "torch", summary: "the Core IR op by op", codeView: null, dtypes: ["f32"], devices: ["cpu", "cuda"], numerics: ["equivalent", "fast"], canTrain: false, available: true, reason: null },
  { name: "torch", label: "PyTorch", family: "torch", summary: "the generated PyTorch, eager", codeView: "torch", dtypes: ["f32", "bf16"], devices: ["cpu", "cuda"], numerics: ["equivalent", "fast"], canTrain: false, available: true, reason: null },
  { name: "cuda-graphs", label: "PyTorch (CUDA graphs)", family: "torch", summary: "the decode step replayed as a CUDA graph", codeView: "torch", dtypes: ["f32"], devices: ["cuda"], numerics: ["equivalent", "fast"], canTrain: false, available: false, reason: "cuda-graphs runs on cuda, not cpu" },
  { name: "xla", label: "XLA", family: "jax", summary: "the exported StableHLO artifact on XLA", codeView: "stablehlo", dtypes: ["f32"], devices: ["cpu"], numerics: ["equivalent"], canTrain: false, available: true, reason: null },
  { name: "tflite", label: "TF Lite", family: "tf", summary: "a backend this client has never heard of", codeView: "tflite", dtypes: [], devices: [], numerics: [], canTrain: false, available: true, reason: null },
];

describe("parseBackends", () => {
  it("reads the server's answer", () => {
    const backends = parseBackends(ANSWER);
    assert.deepEqual(backends.map((b) => b.name), ["torch-interpret", "torch", "cuda-graphs", "xla", "tflite"]);
    assert.equal(backends[2].available, false);
    assert.equal(backends[2].reason, "cuda-graphs runs on cuda, not cpu");
    assert.equal(backends[0].codeView, null);
  });

  it("drops what is not a backend and fills what is missing", () => {
    const backends = parseBackends([null, 3, { label: "no name" }, { name: "bare" }]);
    assert.deepEqual(backends, [
      { name: "bare", label: "bare", family: "", summary: "", codeView: null, dtypes: [], devices: [], numerics: [], canTrain: false, available: true, reason: null },
    ]);
    assert.deepEqual(parseBackends({ not: "a list" }), []);
  });
});

describe("backendPickItems", () => {
  it("lists what can run here first, in the server's order, and says why the rest cannot", () => {
    const items = backendPickItems(parseBackends(ANSWER));
    assert.deepEqual(
      items.map((i) => [i.backend, i.available]),
      [["torch-interpret", true], ["torch", true], ["xla", true], ["tflite", true], ["cuda-graphs", false]],
    );
    assert.equal(items[1].label, "PyTorch");
    assert.equal(items[1].description, "torch");
    assert.equal(items.at(-1)!.detail, "cannot run here: cuda-graphs runs on cuda, not cpu");
  });
});

describe("codeViewPickItems", () => {
  it("offers each code view once, with the backends that run it, including views it has no command for", () => {
    const items = codeViewPickItems(parseBackends(ANSWER) as BackendInfo[]);
    assert.deepEqual(
      items.map((i) => [i.target, i.label, i.description]),
      [
        ["torch", "PyTorch", "PyTorch, PyTorch (CUDA graphs)"],
        ["stablehlo", "StableHLO", "XLA"],
        ["tflite", "tflite", "TF Lite"],
      ],
    );
  });
});

describe("entriesFromLenses", () => {
  it("names each entry the server's run lenses carry, once", () => {
    const lens = (entry: string, backend: string) => ({
      command: { command: "linnet.run", arguments: [{ uri: "file:///m.linnet", entry, backend, preset: null }] },
    });
    const other = { command: { command: "something.else", arguments: [{ entry: "nope" }] } };
    assert.deepEqual(
      entriesFromLenses([lens("forward", "torch"), lens("forward", "xla"), other, lens("step", "torch"), {}]),
      ["forward", "step"],
    );
    assert.deepEqual(entriesFromLenses(undefined), []);
  });
});
