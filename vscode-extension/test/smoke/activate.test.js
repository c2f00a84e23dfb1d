// Activates the built extension (dist/extension.js) against a stub `vscode` module and the real
// language server, then runs the client's commands. It checks what unit tests cannot: that
// vscode-languageclient starts `<python> -m linnet lsp`, completes the handshake with our
// initializationOptions, and that the custom requests go out with the right params.
//
//   npm run build && npm run test:smoke
//
// The Python comes from LINNET_PYTHON, else the repository's .venv; without one (or without
// linnet's [lsp] extra in it) the test is skipped.
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { spawnSync } = require("node:child_process");
const { test } = require("node:test");
const Module = require("node:module");

const extensionRoot = path.resolve(__dirname, "..", "..");
const repositoryRoot = path.resolve(extensionRoot, "..");
const python = process.env.LINNET_PYTHON || path.join(repositoryRoot, ".venv", "bin", "python");
const example = path.join(repositoryRoot, "examples", "mlp.linnet");

function serverAvailable() {
  if (!fs.existsSync(python)) {
    return false;
  }
  const probe = spawnSync(python, ["-c", "import pygls, linnet.lsp.server"], { cwd: repositoryRoot });
  return probe.status === 0;
}

// ----- the stub: just enough of the VS Code API for the client and our extension

class Disposable {
  constructor(onDispose) {
    this.onDispose = onDispose;
  }
  dispose() {
    this.onDispose?.();
  }
  static from(...items) {
    return new Disposable(() => items.forEach((item) => item?.dispose?.()));
  }
}

class EventEmitter {
  constructor() {
    this.listeners = [];
    this.event = (listener) => {
      this.listeners.push(listener);
      return new Disposable(() => undefined);
    };
  }
  fire(value) {
    this.listeners.forEach((listener) => listener(value));
  }
  dispose() {}
}

class Uri {
  constructor(scheme, authority, uriPath, query = "", fragment = "") {
    Object.assign(this, { scheme, authority, path: uriPath, query, fragment });
  }
  static file(filePath) {
    return new Uri("file", "", filePath);
  }
  static parse(text) {
    const match = /^([\w+.-]+):\/\/([^/]*)([^?#]*)/.exec(text);
    return new Uri(match[1], match[2], decodeURIComponent(match[3]));
  }
  static from(components) {
    return new Uri(components.scheme, components.authority ?? "", components.path, components.query, components.fragment);
  }
  get fsPath() {
    return this.path;
  }
  with(change) {
    return Object.assign(new Uri(this.scheme, this.authority, this.path, this.query, this.fragment), change);
  }
  toString() {
    return `${this.scheme}://${this.authority}${encodeURI(this.path)}`;
  }
}

// Anything the test does not model is a callable that returns a disposable.
function anything(name) {
  return new Proxy(function () {}, {
    get: (_target, key) => (key === "then" ? undefined : anything(`${name}.${String(key)}`)),
    apply: () => new Disposable(() => undefined),
    construct: () => anything(`new ${name}`),
  });
}

function withFallback(object, name) {
  return new Proxy(object, { get: (target, key) => (key in target ? target[key] : anything(`${name}.${String(key)}`)) });
}

function createVscodeStub(state) {
  const text = fs.readFileSync(example, "utf8");
  const document = {
    uri: Uri.file(example),
    fileName: example,
    languageId: "linnet",
    version: 1,
    isClosed: false,
    isUntitled: false,
    lineCount: text.split("\n").length,
    getText: () => text,
  };
  const outputChannel = (name) => ({
    name,
    append: (line) => state.log.push(line),
    appendLine: (line) => state.log.push(line),
    show() {},
    hide() {},
    clear() {},
    replace() {},
    dispose() {},
  });
  const folder = { uri: Uri.file(repositoryRoot), name: "linnet", index: 0 };
  const vscode = {
    version: "1.82.0",
    Disposable,
    EventEmitter,
    Uri,
    CancellationError: class CancellationError extends Error {},
    ViewColumn: { Beside: -2 },
    ProgressLocation: { Window: 10, Notification: 15 },
    StatusBarAlignment: { Right: 2 },
    ConfigurationTarget: { Global: 1, Workspace: 2 },
    env: { appName: "stub", language: "en", machineId: "m", sessionId: "s", uiKind: 1, appRoot: extensionRoot },
    extensions: { getExtension: () => undefined, all: [] },
    commands: withFallback(
      {
        registerCommand(id, handler) {
          state.commands.set(id, handler);
          return new Disposable(() => state.commands.delete(id));
        },
        executeCommand: async (id, ...args) => {
          if (id === "vscode.executeCodeLensProvider") {
            // what the server's code lenses carry for examples/mlp.linnet (its one entry)
            return [{ command: { command: "linnet.run", arguments: [{ uri: args[0].toString(), entry: "forward" }] } }];
          }
          const registered = state.commands.get(id);
          return registered ? registered(...args) : undefined;
        },
        getCommands: async () => [...state.commands.keys()],
      },
      "commands",
    ),
    languages: withFallback(
      {
        match: (_selector, doc) => (doc.languageId === "linnet" ? 10 : 0),
        setTextDocumentLanguage: async (doc, language) => Object.assign(doc, { languageId: language }),
      },
      "languages",
    ),
    window: withFallback(
      {
        activeTextEditor: { document },
        visibleTextEditors: [],
        createOutputChannel: outputChannel,
        createStatusBarItem: () => ({ show() {}, hide() {}, dispose() {} }),
        withProgress: async (_options, task) =>
          task({ report() {} }, { isCancellationRequested: false, onCancellationRequested: () => new Disposable() }),
        showTextDocument: async (doc) => {
          state.shown.push(doc);
          return {};
        },
        showQuickPick: async (items) => {
          state.quickPicks.push(items);
          // the preset `tiny`, the JAX code view, the PyTorch backend
          return items.find((item) => item.preset === "tiny" || item.target === "jax" || item.backend === "torch");
        },
        showErrorMessage: async (message) => void state.messages.push(message),
        showWarningMessage: async (message) => void state.messages.push(message),
        showInformationMessage: async (message) => void state.infos.push(message),
      },
      "window",
    ),
    workspace: withFallback(
      {
        workspaceFolders: [folder],
        textDocuments: [document],
        getWorkspaceFolder: () => folder,
        getConfiguration: (section) => ({
          get: (key, fallback) => (section === "linnet" && key in state.settings ? state.settings[key] : fallback),
          has: () => false,
          inspect: () => undefined,
          update: async (key, value, target) => void state.settingUpdates.push([key, value, target]),
        }),
        registerTextDocumentContentProvider: (_scheme, provider) => {
          state.contentProvider = provider;
          return new Disposable();
        },
        openTextDocument: async (uri) => ({
          uri,
          languageId: uri.path.endsWith(".py") ? "python" : "plaintext",
          getText: () => state.contentProvider.provideTextDocumentContent(uri),
        }),
      },
      "workspace",
    ),
  };
  for (const namespace of ["debug", "tasks", "notebooks", "tests", "l10n", "authentication", "scm", "comments"]) {
    vscode[namespace] = anything(namespace);
  }
  // Classes the client extends or converts results into; the requests used here need no real ones.
  for (const name of ["Range", "Position", "Location", "Selection", "Diagnostic", "DiagnosticRelatedInformation",
    "DiagnosticSeverity", "DiagnosticTag", "CodeLens", "Command", "CodeAction", "CodeActionKind", "CodeActionTriggerKind",
    "MarkdownString", "Hover", "TextEdit", "WorkspaceEdit", "TextDocumentEdit", "SnippetString", "CompletionItem",
    "CompletionItemKind", "CompletionItemTag", "CompletionList", "CompletionTriggerKind", "SignatureHelp",
    "SignatureInformation", "ParameterInformation", "SignatureHelpTriggerKind", "DocumentHighlight",
    "DocumentHighlightKind", "DocumentSymbol", "SymbolInformation", "SymbolKind", "SymbolTag", "DocumentLink",
    "Color", "ColorInformation", "ColorPresentation", "FoldingRange", "FoldingRangeKind", "SelectionRange",
    "CallHierarchyItem", "TypeHierarchyItem", "SemanticTokensLegend", "SemanticTokens", "SemanticTokensEdit",
    "SemanticTokensEdits", "LinkedEditingRanges", "InlineValueText", "InlayHint", "InlayHintKind",
    "InlineCompletionItem", "InlineCompletionList", "NotebookCellData", "NotebookData", "CancellationTokenSource",
    "RelativePattern", "TextDocumentSaveReason", "TextEditorRevealType", "ExtensionMode", "UIKind", "FileType",
    "IndentAction"]) {
    vscode[name] = anything(name);
  }
  return vscode;
}

test("the extension starts `linnet lsp` and its commands reach the server", { skip: !serverAvailable() && `no Python with linnet[lsp] at ${python}` }, async () => {
  const bundle = path.join(extensionRoot, "dist", "extension.js");
  assert.ok(fs.existsSync(bundle), "run `npm run build` first");
  const state = {
    settings: { interpreter: python, preset: "tiny", "inlayHints.shapes": true, "inlayHints.maxLength": 40, "trace.server": "verbose" },
    log: [],
    commands: new Map(),
    shown: [],
    quickPicks: [],
    settingUpdates: [],
    messages: [],
    infos: [],
  };
  const vscode = createVscodeStub(state);
  const load = Module._load;
  Module._load = function (request, ...rest) {
    return request === "vscode" ? vscode : load.call(this, request, ...rest);
  };
  const extension = require(bundle);
  try {
    await extension.activate({ subscriptions: [], extensionPath: extensionRoot, asAbsolutePath: (p) => path.join(extensionRoot, p) });

    // The client registers the server's executeCommand commands itself, next to ours.
    const deadline = Date.now() + 30000;
    while (!state.commands.has("linnet.run") && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    for (const command of ["linnet.showIR", "linnet.showGeneratedTorch", "linnet.pickPreset", "linnet.restartServer", "linnet.run", "linnet.selectPreset"]) {
      assert.ok(state.commands.has(command), `${command} is registered`);
    }
    const trace = state.log.join("\n");
    assert.match(trace, /Starting .* -m linnet lsp \(interpreter from setting\)/);
    assert.match(trace, /"initializationOptions": \{\s*"preset": "tiny",\s*"inlayHints": \{\s*"shapes": true,\s*"maxLength": 40/);
    assert.match(trace, /Sending notification 'textDocument\/didOpen'/);

    await state.commands.get("linnet.showGeneratedTorch")();
    await state.commands.get("linnet.showIR")();
    assert.deepEqual(state.messages, []);
    const [torch, ir] = state.shown;
    assert.equal(torch.uri.path, "/mlp.torch.py");
    assert.equal(torch.languageId, "python");
    assert.match(torch.getText(), /import torch/);
    assert.equal(ir.uri.path, "/mlp.ir.txt");
    assert.equal(ir.languageId, "plaintext");
    assert.match(ir.getText(), /model Mlp, preset tiny/);

    await state.commands.get("linnet.pickPreset")();
    assert.deepEqual(state.quickPicks[0].map((item) => item.preset), ["", "tiny"]);
    assert.deepEqual(state.settingUpdates, [["preset", "tiny", vscode.ConfigurationTarget.Workspace]]);

    // The code views and the backends come from the server's registry (`linnet/backends`).
    await state.commands.get("linnet.showGenerated")();
    assert.deepEqual(state.quickPicks[1].map((item) => item.target), ["torch", "jax", "stablehlo", "onnx"]);
    assert.equal(state.shown.at(-1).uri.path, "/mlp.jax.py");
    assert.match(state.shown.at(-1).getText(), /import jax/);
    await state.commands.get("linnet.runEntry")();
    const backends = state.quickPicks[2];
    assert.ok(backends.some((item) => item.backend === "onnxruntime"), "every backend is offered");
    assert.equal(backends.find((item) => item.backend === "cuda-graphs").available, false);
    assert.deepEqual(state.messages, []);
    assert.match(state.infos.at(-1), /^forward on PyTorch under preset `tiny`: \[1, 2\] float32/);
  } finally {
    await extension.deactivate();
    Module._load = load;
  }
});
