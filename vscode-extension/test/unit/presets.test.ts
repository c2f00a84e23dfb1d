import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { DEFAULTS_LABEL, presetPickItems, presetStatusText } from "../../src/presets";

describe("presetPickItems", () => {
  it("lists the automatic choice first, then the presets, and marks the current one", () => {
    const items = presetPickItems(["smollm2_135m", "tinyllama_1_1b"], "tinyllama_1_1b");
    assert.deepEqual(
      items.map((i) => [i.label, i.preset, i.description]),
      [
        [DEFAULTS_LABEL, "", "each file's first preset"],
        ["smollm2_135m", "smollm2_135m", undefined],
        ["tinyllama_1_1b", "tinyllama_1_1b", "current"],
      ],
    );
  });

  it("marks the automatic choice when no preset is set", () => {
    const [defaults] = presetPickItems(["tiny"], "");
    assert.equal(defaults.description, "each file's first preset · current");
  });

  it("drops duplicates and blanks", () => {
    assert.deepEqual(
      presetPickItems(["a", "a", " ", "b"], undefined).map((i) => i.preset),
      ["", "a", "b"],
    );
  });

  it("keeps a current preset the file does not declare, so it can be unset", () => {
    const items = presetPickItems(["tiny"], "gone");
    assert.deepEqual(items.at(-1), { label: "gone", description: "current · not declared in this file", preset: "gone" });
  });
});

describe("presetStatusText", () => {
  it("names the preset or the automatic choice", () => {
    assert.equal(presetStatusText("tiny"), "Linnet: tiny");
    assert.equal(presetStatusText(""), "Linnet: first preset");
  });
});
