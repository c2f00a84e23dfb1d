// The VS Code side of Linnet: starts `<python> -m linnet lsp`, forwards the `linnet.*` settings,
// and adds the palette commands. Decisions live in the pure modules (interpreter, settings,
// protocol, presets); this file wires them to the VS Code API.

import * as vscode from "vscode";
import {
  LanguageClient,
  LanguageClientOptions,
  ResponseError,
  ServerOptions,
  State,
} from "vscode-languageclient/node";
import { backendPickItems, codeViewPickItems, entriesFromLenses } from "./backends";
import { SERVER_ARGS, resolveInterpreter } from "./interpreter";
import { presetPickItems, presetStatusText } from "./presets";
import {
  BACKENDS_REQUEST,
  BackendInfo,
  OutputView,
  PICK_PRESET_COMMAND,
  PRESETS_REQUEST,
  RESTART_SERVER_COMMAND,
  RUN_COMMAND,
  RUN_ENTRY_COMMAND,
  SHOW_COMMANDS,
  SHOW_GENERATED_PICK_COMMAND,
  isComparisonReport,
  languageForView,
  outputDocumentPath,
  parseBackends,
  presetsParams,
  runArguments,
  showRequest,
  viewTitle,
} from "./protocol";
import { onPythonEnvironmentChanged, pythonEnvironments } from "./pythonExtension";
import { CONFIGURATION_SECTION, initializationOptions, readSettings } from "./settings";

const LANGUAGE_ID = "linnet";
const OUTPUT_SCHEME = "linnet-output";

let server: ServerController | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const log = vscode.window.createOutputChannel("Linnet Language Server");
  const outputs = new OutputDocuments();
  const editors = new LinnetEditorTracker();
  server = new ServerController(log);
  const status = new PresetStatus(editors);

  context.subscriptions.push(
    log,
    outputs,
    editors,
    status,
    vscode.workspace.registerTextDocumentContentProvider(OUTPUT_SCHEME, outputs),
    ...SHOW_COMMANDS.map(({ command, view }) =>
      vscode.commands.registerCommand(command, (uri?: unknown) => showOutput(view, editors.sourceUri(uri), outputs)),
    ),
    vscode.commands.registerCommand(SHOW_GENERATED_PICK_COMMAND, (uri?: unknown) =>
      pickCodeView(editors.sourceUri(uri), outputs),
    ),
    vscode.commands.registerCommand(RUN_ENTRY_COMMAND, (uri?: unknown) => runEntry(editors.sourceUri(uri))),
    vscode.commands.registerCommand(PICK_PRESET_COMMAND, (uri?: unknown) => pickPreset(editors.sourceUri(uri))),
    vscode.commands.registerCommand(RESTART_SERVER_COMMAND, () => server?.restart()),
    vscode.workspace.onDidChangeConfiguration((event) => {
      // The server command line is fixed when it starts; other settings reach the running
      // server as workspace/didChangeConfiguration (synchronize.configurationSection).
      if (event.affectsConfiguration(`${CONFIGURATION_SECTION}.interpreter`)) {
        void server?.restart();
      }
      if (event.affectsConfiguration(`${CONFIGURATION_SECTION}.preset`)) {
        status.update();
      }
    }),
    server,
  );
  status.update();
  // Not awaited: a slow or failing server must not hold up activation (or the commands).
  void server.start();
}

export async function deactivate(): Promise<void> {
  await server?.stop();
  server = undefined;
}

function settingReader(scope?: vscode.Uri) {
  const configuration = vscode.workspace.getConfiguration(CONFIGURATION_SECTION, scope);
  return <T>(key: string, fallback: T): T => configuration.get<T>(key, fallback);
}

/** Owns the LanguageClient; restart builds a new one because the interpreter may have changed. */
class ServerController implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private starting: Promise<void> | undefined;
  private pythonEnvironmentWatch: vscode.Disposable | undefined;

  constructor(private readonly log: vscode.OutputChannel) {}

  start(): Promise<void> {
    this.starting ??= this.startClient().finally(() => (this.starting = undefined));
    return this.starting;
  }

  async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (client && client.state !== State.Stopped) {
      try {
        await client.stop();
      } catch (error) {
        this.log.appendLine(`Stopping the server failed: ${String(error)}`);
      }
    }
  }

  async restart(): Promise<void> {
    await this.starting;
    await this.stop();
    await this.start();
  }

  /** Sends a request to the running server; rejects with a readable message when there is none. */
  async request<R>(method: string, params: object, token?: vscode.CancellationToken): Promise<R> {
    await this.starting;
    if (!this.client || this.client.state !== State.Running) {
      throw new Error("the Linnet language server is not running (see the 'Linnet Language Server' output)");
    }
    // An undefined token would be sent as a second, positional parameter.
    return token ? this.client.sendRequest<R>(method, params, token) : this.client.sendRequest<R>(method, params);
  }

  private async startClient(): Promise<void> {
    const folder = vscode.workspace.workspaceFolders?.[0];
    const settings = readSettings(settingReader(folder?.uri));
    const interpreter = await resolveInterpreter({
      configured: settings.interpreter,
      platform: process.platform,
      pythonEnvironments,
      resource: folder?.uri,
      log: (message) => this.log.appendLine(message),
    });
    if (interpreter.source === "python-extension") {
      await this.followPythonEnvironment();
    }
    const commandLine = `${interpreter.command} ${SERVER_ARGS.join(" ")}`;
    this.log.appendLine(`Starting ${commandLine} (interpreter from ${interpreter.source})`);

    const serverOptions: ServerOptions = {
      command: interpreter.command,
      // No `transport`: TransportKind.stdio would append `--stdio`, which `linnet lsp` rejects;
      // an Executable without one talks over stdin/stdout all the same.
      args: [...SERVER_ARGS],
      options: { cwd: folder?.uri.fsPath },
    };
    const clientOptions: LanguageClientOptions = {
      documentSelector: [
        { scheme: "file", language: LANGUAGE_ID },
        { scheme: "untitled", language: LANGUAGE_ID },
      ],
      synchronize: { configurationSection: CONFIGURATION_SECTION },
      initializationOptions: initializationOptions(settings),
      // The server reports runs (linnet.run from its code lenses) with work-done progress,
      // a message and a log line, so the client adds nothing to them.
      outputChannel: this.log,
      middleware: {
        window: {
          // The "Compare" lens's report opens as a file; make its editor read-only in this session.
          showDocument: async (params, next) => {
            const result = await next(params, new vscode.CancellationTokenSource().token);
            const success = !(result instanceof ResponseError) && result.success;
            if (success && isComparisonReport(params.uri)) {
              await vscode.commands.executeCommand("workbench.action.files.setActiveEditorReadonlyInSession");
            }
            return { success };
          },
        },
      },
    };
    const client = new LanguageClient(LANGUAGE_ID, "Linnet Language Server", serverOptions, clientOptions);
    this.client = client;
    try {
      await client.start();
    } catch (error) {
      this.log.appendLine(`The server did not start: ${String(error)}`);
      void this.reportStartFailure(commandLine);
    }
  }

  // Only when the Python extension chose the interpreter (it is active then) does picking
  // another environment there concern the server.
  private async followPythonEnvironment(): Promise<void> {
    this.pythonEnvironmentWatch ??= await onPythonEnvironmentChanged(() => {
      if (!readSettings(settingReader()).interpreter.trim()) {
        void this.restart();
      }
    });
  }

  dispose(): void {
    this.pythonEnvironmentWatch?.dispose();
    this.pythonEnvironmentWatch = undefined;
  }

  private async reportStartFailure(commandLine: string): Promise<void> {
    const openSettings = "Set linnet.interpreter";
    const showLog = "Show Log";
    const choice = await vscode.window.showErrorMessage(
      `Linnet: the language server did not start (\`${commandLine}\`). ` +
        "Install linnet with its [lsp] extra in that Python, or choose another interpreter.",
      openSettings,
      showLog,
    );
    if (choice === openSettings) {
      await vscode.commands.executeCommand("workbench.action.openSettings", `${CONFIGURATION_SECTION}.interpreter`);
    } else if (choice === showLog) {
      this.log.show();
    }
  }
}

/** Remembers the last Linnet editor, so commands still know the source while an output is focused. */
class LinnetEditorTracker implements vscode.Disposable {
  private lastLinnetUri: vscode.Uri | undefined;
  private readonly subscription: vscode.Disposable;
  private readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChange = this.changed.event;

  constructor() {
    this.remember(vscode.window.activeTextEditor);
    this.subscription = vscode.window.onDidChangeActiveTextEditor((editor) => {
      this.remember(editor);
      this.changed.fire();
    });
  }

  get activeIsLinnet(): boolean {
    return vscode.window.activeTextEditor?.document.languageId === LANGUAGE_ID;
  }

  /** The document a command acts on: an explicit URI argument, else the active or last Linnet editor. */
  sourceUri(argument?: unknown): vscode.Uri | undefined {
    if (argument instanceof vscode.Uri) {
      return argument;
    }
    return this.activeIsLinnet ? vscode.window.activeTextEditor?.document.uri : this.lastLinnetUri;
  }

  private remember(editor: vscode.TextEditor | undefined): void {
    if (editor?.document.languageId === LANGUAGE_ID) {
      this.lastLinnetUri = editor.document.uri;
    }
  }

  dispose(): void {
    this.subscription.dispose();
    this.changed.dispose();
  }
}

/** Read-only documents holding the server's IR and generated code (a content provider cannot be edited). */
class OutputDocuments implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly contents = new Map<string, string>();
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.changed.event;

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.contents.get(uri.toString()) ?? "";
  }

  set(uri: vscode.Uri, text: string): void {
    this.contents.set(uri.toString(), text);
    this.changed.fire(uri);
  }

  dispose(): void {
    this.changed.dispose();
  }
}

async function showOutput(view: OutputView, source: vscode.Uri | undefined, outputs: OutputDocuments): Promise<void> {
  if (!source) {
    void vscode.window.showWarningMessage("Linnet: open a .linnet file first.");
    return;
  }
  const preset = readSettings(settingReader(source)).preset;
  const { method, params } = showRequest(view, source.toString(), preset);
  try {
    const text = await vscode.window.withProgress(
      {
        location: vscode.ProgressLocation.Window,
        title: `Linnet: ${viewTitle(view)}`,
        cancellable: true,
      },
      (_progress, token) => server!.request<string>(method, params, token),
    );
    if (typeof text !== "string") {
      void vscode.window.showWarningMessage(`Linnet: the server returned no ${viewTitle(view)} for this file.`);
      return;
    }
    // The source URI in the query keeps outputs of same-named files in different folders apart.
    const uri = vscode.Uri.from({
      scheme: OUTPUT_SCHEME,
      path: outputDocumentPath(source.toString(), view),
      query: source.toString(),
    });
    outputs.set(uri, text);
    let document = await vscode.workspace.openTextDocument(uri);
    const language = languageForView(view);
    if (document.languageId !== language) {
      document = await vscode.languages.setTextDocumentLanguage(document, language);
    }
    await vscode.window.showTextDocument(document, { viewColumn: vscode.ViewColumn.Beside, preview: true });
  } catch (error) {
    if (!(error instanceof vscode.CancellationError)) {
      void vscode.window.showErrorMessage(`Linnet: could not show ${viewTitle(view)}: ${messageOf(error)}`);
    }
  }
}

/** The server's backend registry (`linnet/backends`), or undefined (with a warning) when it cannot answer. */
async function serverBackends(): Promise<BackendInfo[] | undefined> {
  try {
    const backends = parseBackends(await server!.request<unknown>(BACKENDS_REQUEST, {}));
    if (backends.length === 0) {
      void vscode.window.showWarningMessage("Linnet: the server lists no backends (is it an older version?).");
      return undefined;
    }
    return backends;
  } catch (error) {
    void vscode.window.showWarningMessage(`Linnet: could not list backends: ${messageOf(error)}`);
    return undefined;
  }
}

/** "Show Generated Code…": one of the code views the server's backends have. */
async function pickCodeView(source: vscode.Uri | undefined, outputs: OutputDocuments): Promise<void> {
  if (!source) {
    void vscode.window.showWarningMessage("Linnet: open a .linnet file first.");
    return;
  }
  const backends = await serverBackends();
  if (!backends) {
    return;
  }
  const choice = await vscode.window.showQuickPick(codeViewPickItems(backends), {
    title: "Linnet: generated code",
    placeHolder: "The code a backend runs, under the selected preset",
    matchOnDescription: true,
  });
  if (choice) {
    await showOutput({ kind: "generated", target: choice.target }, source, outputs);
  }
}

/** "Run Entry…": an entry of the file (as the server's code lenses name them) on one of the server's
 * backends, run by the server's `linnet.run` (which reports the result itself). */
async function runEntry(source: vscode.Uri | undefined): Promise<void> {
  if (!source) {
    void vscode.window.showWarningMessage("Linnet: open a .linnet file first.");
    return;
  }
  const backends = await serverBackends();
  if (!backends) {
    return;
  }
  const lenses = await vscode.commands.executeCommand<unknown[]>("vscode.executeCodeLensProvider", source);
  const entries = entriesFromLenses(lenses as Parameters<typeof entriesFromLenses>[0]);
  if (entries.length === 0) {
    void vscode.window.showWarningMessage("Linnet: this file has no entry function to run (`entry fn` in a `model`).");
    return;
  }
  const entry =
    entries.length === 1 ? entries[0] : await vscode.window.showQuickPick(entries, { title: "Linnet: entry to run" });
  if (!entry) {
    return;
  }
  const choice = await vscode.window.showQuickPick(backendPickItems(backends), {
    title: `Linnet: run ${entry} on`,
    matchOnDescription: true,
    matchOnDetail: true,
  });
  if (!choice) {
    return;
  }
  if (!choice.available) {
    void vscode.window.showWarningMessage(`Linnet: ${choice.label} ${choice.detail ?? "cannot run here"}`);
    return;
  }
  const preset = readSettings(settingReader(source)).preset;
  try {
    await vscode.commands.executeCommand(RUN_COMMAND, runArguments(source.toString(), entry, choice.backend, preset));
  } catch {
    // The server has shown the failure (window/showMessage); nothing to add.
  }
}

async function pickPreset(source: vscode.Uri | undefined): Promise<void> {
  let presets: string[] = [];
  if (source) {
    try {
      const answer = await server!.request<unknown>(PRESETS_REQUEST, presetsParams(source.toString()));
      presets = Array.isArray(answer) ? answer.filter((name): name is string => typeof name === "string") : [];
    } catch (error) {
      void vscode.window.showWarningMessage(`Linnet: could not list presets: ${messageOf(error)}`);
    }
  }
  const configuration = vscode.workspace.getConfiguration(CONFIGURATION_SECTION, source);
  const items = presetPickItems(presets, configuration.get<string>("preset", ""));
  const choice = await vscode.window.showQuickPick(items, {
    title: "Linnet preset",
    placeHolder: "Preset for hovers, inlay hints, generated code and runs",
    matchOnDescription: true,
  });
  if (!choice) {
    return;
  }
  // Without a folder open there are no workspace settings to write to.
  const target = vscode.workspace.workspaceFolders?.length
    ? vscode.ConfigurationTarget.Workspace
    : vscode.ConfigurationTarget.Global;
  await configuration.update("preset", choice.preset, target);
}

/** Shows the preset in the status bar while a Linnet file is active; clicking picks another. */
class PresetStatus implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  private readonly subscription: vscode.Disposable;

  constructor(private readonly editors: LinnetEditorTracker) {
    this.item.command = PICK_PRESET_COMMAND;
    this.item.tooltip = "Linnet preset for hovers, inlay hints, generated code and runs";
    this.subscription = editors.onDidChange(() => this.update());
  }

  update(): void {
    if (!this.editors.activeIsLinnet) {
      this.item.hide();
      return;
    }
    const source = this.editors.sourceUri();
    this.item.text = presetStatusText(readSettings(settingReader(source)).preset);
    this.item.show();
  }

  dispose(): void {
    this.subscription.dispose();
    this.item.dispose();
  }
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
