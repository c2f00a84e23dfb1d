import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { DEFAULT_SETTINGS, initializationOptions, presetOrNull, readSettings, SettingReader } from "../../src/settings";

function reader(values: Record<string, unknown>): SettingReader {
  return <T>(key: string, fallback: T): T => (key in values ? (values[key] as T) : fallback);
}

describe("readSettings", () => {
  it("gives the defaults when nothing is set", () => {
    assert.deepEqual(readSettings(reader({})), DEFAULT_SETTINGS);
  });

  it("reads nested keys of the linnet section", () => {
    const settings = readSettings(
      reader({
        interpreter: "/py",
        preset: "tiny",
        "inlayHints.shapes": false,
        "inlayHints.maxLength": 60,
        "inlayHints.parameters": true,
      }),
    );
    assert.deepEqual(settings, {
      interpreter: "/py",
      preset: "tiny",
      inlayHints: { shapes: false, maxLength: 60, parameters: true },
    });
  });

  it("replaces a nonsensical maxLength with the default", () => {
    for (const bad of [0, -3, Number.NaN, "long" as unknown]) {
      assert.equal(readSettings(reader({ "inlayHints.maxLength": bad })).inlayHints.maxLength, 40);
    }
    assert.equal(readSettings(reader({ "inlayHints.maxLength": 12.7 })).inlayHints.maxLength, 12);
  });
});

describe("initializationOptions", () => {
  it("sends the preset and inlay hint settings, the defaults as preset null", () => {
    assert.deepEqual(initializationOptions(DEFAULT_SETTINGS), {
      preset: null,
      inlayHints: { shapes: true, maxLength: 40, parameters: false },
    });
    const options = initializationOptions({ ...DEFAULT_SETTINGS, preset: "smollm2_135m", interpreter: "/py" });
    assert.equal(options.preset, "smollm2_135m");
    assert.equal("interpreter" in options, false, "the interpreter concerns only the client");
  });

  it("maps a blank preset to null", () => {
    assert.equal(presetOrNull(""), null);
    assert.equal(presetOrNull("  "), null);
    assert.equal(presetOrNull(undefined), null);
    assert.equal(presetOrNull(" tiny "), "tiny");
  });
});
