// Checks that package.json, the JSON contributions and the pure modules agree, since VS Code
// only reports such mismatches at run time (or silently ignores them).
import assert from "node:assert/strict";
import { readFileSync, existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, it } from "node:test";
import { CLIENT_COMMANDS, SERVER_COMMANDS } from "../../src/protocol";
import { DEFAULT_SETTINGS } from "../../src/settings";

// Compiled to out/test/unit/, three levels below the extension's root.
const root = resolve(__dirname, "..", "..", "..");
const readJson = (path: string) => JSON.parse(readFileSync(join(root, path), "utf8"));
const manifest = readJson("package.json");

describe("package.json", () => {
  it("contributes exactly the commands the client registers", () => {
    const contributed = manifest.contributes.commands.map((c: { command: string }) => c.command);
    assert.deepEqual([...contributed].sort(), [...CLIENT_COMMANDS].sort());
    for (const command of SERVER_COMMANDS) {
      assert.equal(contributed.includes(command), false, `${command} belongs to the server`);
    }
  });

  it("declares setting defaults that match the client's", () => {
    const properties = manifest.contributes.configuration.properties;
    assert.equal(properties["linnet.interpreter"].default, DEFAULT_SETTINGS.interpreter);
    assert.equal(properties["linnet.preset"].default, DEFAULT_SETTINGS.preset);
    assert.equal(properties["linnet.inlayHints.shapes"].default, DEFAULT_SETTINGS.inlayHints.shapes);
    assert.equal(properties["linnet.inlayHints.maxLength"].default, DEFAULT_SETTINGS.inlayHints.maxLength);
    assert.equal(properties["linnet.inlayHints.parameters"].default, DEFAULT_SETTINGS.inlayHints.parameters);
    assert.deepEqual(properties["linnet.trace.server"].enum, ["off", "messages", "verbose"]);
  });

  it("activates on the linnet language and points at files that exist", () => {
    assert.deepEqual(manifest.activationEvents, ["onLanguage:linnet"]);
    assert.equal(manifest.engines.vscode, "^1.82.0");
    const [language] = manifest.contributes.languages;
    assert.equal(language.id, "linnet");
    assert.deepEqual(language.extensions, [".linnet"]);
    for (const path of [
      language.configuration,
      manifest.contributes.grammars[0].path,
      manifest.contributes.snippets[0].path,
      "README.md",
      "LICENSE",
    ]) {
      assert.ok(existsSync(join(root, path)), path);
    }
  });
});

describe("contributed JSON", () => {
  it("has a grammar for source.linnet", () => {
    const grammar = readJson("syntaxes/linnet.tmLanguage.json");
    assert.equal(grammar.scopeName, "source.linnet");
    assert.equal(grammar.scopeName, manifest.contributes.grammars[0].scopeName);
    // Every `include: #name` must name a repository entry, or VS Code drops the rule silently.
    const includes = JSON.stringify(grammar).match(/"include":"#[^"]+"/g) ?? [];
    for (const include of includes) {
      const name = include.slice('"include":"#'.length, -1);
      assert.ok(grammar.repository[name], `missing repository entry ${name}`);
    }
  });

  it("has a language configuration with # comments", () => {
    const configuration = readJson("language-configuration.json");
    assert.equal(configuration.comments.lineComment, "#");
  });

  it("has snippets for the items and statements", () => {
    const snippets = readJson("snippets/linnet.json");
    const prefixes = Object.values(snippets).map((s) => (s as { prefix: string }).prefix);
    for (const prefix of ["module", "model", "fn", "entry", "config", "preset", "let", "for"]) {
      assert.ok(prefixes.includes(prefix), prefix);
    }
  });
});
