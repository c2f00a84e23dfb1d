// Linnet's custom LSP requests and the client's commands, as plain data and functions, so that
// params and command tables are unit-tested without VS Code.

import { presetOrNull } from "./settings";

export const SHOW_IR_REQUEST = "linnet/showIR";
export const SHOW_GENERATED_REQUEST = "linnet/showGenerated";
export const PRESETS_REQUEST = "linnet/presets";
export const BACKENDS_REQUEST = "linnet/backends";

export const RUN_COMMAND = "linnet.run";
/** The server's "Compare" lens command: it writes a report and opens it with window/showDocument. */
export const COMPARE_COMMAND = "linnet.compare";
/** Commands the server registers through workspace/executeCommand (code lenses invoke them).
 * vscode-languageclient registers these names itself, so the client must not. */
/** The server's "Diff against transformers" and "Verify" lenses: a diagnostic on the first diverging member. */
export const DIFF_COMMAND = "linnet.diff";
export const VERIFY_COMMAND = "linnet.verify";
export const SERVER_COMMANDS = [RUN_COMMAND, COMPARE_COMMAND, DIFF_COMMAND, VERIFY_COMMAND, "linnet.selectPreset"] as const;

/** Whether a window/showDocument URI is one of the server's comparison reports
 * (`<cache folder>/reports/<file>-<hash>.<entry>.compare.md`, docs/editors.md), which the client
 * shows read-only: the file is read-only on disk, but VS Code only honours that with
 * `files.readonlyFromPermissions`. */
export function isComparisonReport(uri: string): boolean {
  return /^file:\/\/.*\/reports\/[^/]+\.compare\.md$/.test(uri);
}

/** A code view the server can show (`linnet/showGenerated`'s target): the registry's `codeView`s,
 * of which these four have a command of their own. */
export type GeneratedTarget = "torch" | "jax" | "stablehlo" | "onnx" | (string & {});

/** One backend of the server's registry, as `linnet/backends` answers. */
export interface BackendInfo {
  name: string;
  label: string;
  family: string;
  summary: string;
  codeView: string | null;
  dtypes: string[];
  devices: string[];
  numerics: string[];
  canTrain: boolean;
  available: boolean;
  reason: string | null;
}

/** `linnet/backends`' answer as a list of backends; entries that are not well-formed are dropped
 * (an older or newer server may answer something else). */
export function parseBackends(answer: unknown): BackendInfo[] {
  if (!Array.isArray(answer)) {
    return [];
  }
  const strings = (value: unknown): string[] =>
    Array.isArray(value) ? value.filter((item): item is string => typeof item === "string") : [];
  const out: BackendInfo[] = [];
  for (const item of answer) {
    if (typeof item !== "object" || item === null || typeof (item as { name?: unknown }).name !== "string") {
      continue;
    }
    const b = item as Record<string, unknown>;
    const name = b.name as string;
    out.push({
      name,
      label: typeof b.label === "string" ? b.label : name,
      family: typeof b.family === "string" ? b.family : "",
      summary: typeof b.summary === "string" ? b.summary : "",
      codeView: typeof b.codeView === "string" ? b.codeView : null,
      dtypes: strings(b.dtypes),
      devices: strings(b.devices),
      numerics: strings(b.numerics),
      canTrain: b.canTrain === true,
      available: b.available !== false,
      reason: typeof b.reason === "string" ? b.reason : null,
    });
  }
  return out;
}

export interface RunArguments {
  uri: string;
  entry: string;
  backend: string;
  preset: string | null;
}

/** The one argument of the server's `linnet.run` command. */
export function runArguments(uri: string, entry: string, backend: string, preset: string | undefined): RunArguments {
  return { uri, entry, backend, preset: presetOrNull(preset) };
}

/** What a "show" command displays: the Core IR or one backend's generated code. */
export type OutputView = { kind: "ir" } | { kind: "generated"; target: GeneratedTarget };

export interface ShowParams {
  uri: string;
  target?: GeneratedTarget;
  preset: string | null;
}

export interface PresetsParams {
  uri: string;
}

export interface ShowRequest {
  method: typeof SHOW_IR_REQUEST | typeof SHOW_GENERATED_REQUEST;
  params: ShowParams;
}

/** The request behind a view of the document `uri` under the preset setting `preset`. */
export function showRequest(view: OutputView, uri: string, preset: string | undefined): ShowRequest {
  if (view.kind === "ir") {
    return { method: SHOW_IR_REQUEST, params: { uri, preset: presetOrNull(preset) } };
  }
  return {
    method: SHOW_GENERATED_REQUEST,
    params: { uri, target: view.target, preset: presetOrNull(preset) },
  };
}

export function presetsParams(uri: string): PresetsParams {
  return { uri };
}

export interface ShowCommand {
  command: string;
  view: OutputView;
}

export const SHOW_COMMANDS: readonly ShowCommand[] = [
  { command: "linnet.showIR", view: { kind: "ir" } },
  { command: "linnet.showGeneratedTorch", view: { kind: "generated", target: "torch" } },
  { command: "linnet.showGeneratedJax", view: { kind: "generated", target: "jax" } },
  { command: "linnet.showGeneratedStableHLO", view: { kind: "generated", target: "stablehlo" } },
  { command: "linnet.showGeneratedOnnx", view: { kind: "generated", target: "onnx" } },
];

export const PICK_PRESET_COMMAND = "linnet.pickPreset";
export const RESTART_SERVER_COMMAND = "linnet.restartServer";
/** Pick a code view among the server's backends' (`linnet/backends`) and show it. */
export const SHOW_GENERATED_PICK_COMMAND = "linnet.showGenerated";
/** Pick an entry and one of the server's backends (`linnet/backends`), then run it (`linnet.run`). */
export const RUN_ENTRY_COMMAND = "linnet.runEntry";

/** Every command the client registers; package.json contributes exactly these. */
export const CLIENT_COMMANDS: readonly string[] = [
  ...SHOW_COMMANDS.map((c) => c.command),
  SHOW_GENERATED_PICK_COMMAND,
  RUN_ENTRY_COMMAND,
  PICK_PRESET_COMMAND,
  RESTART_SERVER_COMMAND,
];

/** Generated PyTorch and JAX are Python; IR, StableHLO and ONNX text get no highlighting. */
export function languageForView(view: OutputView): "python" | "plaintext" {
  if (view.kind === "generated" && (view.target === "torch" || view.target === "jax")) {
    return "python";
  }
  return "plaintext";
}

const VIEW_SUFFIX: Record<string, string> = {
  ir: "ir.txt",
  torch: "torch.py",
  jax: "jax.py",
  stablehlo: "stablehlo.mlir.txt",
  onnx: "onnx.txt",
};

const VIEW_TITLE: Record<string, string> = { torch: "PyTorch", jax: "JAX", stablehlo: "StableHLO", onnx: "ONNX" };

/** The path of the read-only output document: `/gpt2.torch.py` for examples/gpt2.linnet. */
export function outputDocumentPath(sourceUri: string, view: OutputView): string {
  const lastSegment = sourceUri.replace(/[?#].*$/, "").split(/[\\/]/).pop() || "untitled";
  const stem = decodeURIComponentSafe(lastSegment).replace(/\.linnet$/, "");
  const key = view.kind === "ir" ? "ir" : view.target;
  const suffix = VIEW_SUFFIX[key] ?? `${key.replace(/[^\w.-]/g, "_")}.txt`;
  return `/${stem}.${suffix}`;
}

function decodeURIComponentSafe(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

export function viewTitle(view: OutputView): string {
  if (view.kind === "ir") {
    return "Core IR";
  }
  return VIEW_TITLE[view.target] ?? view.target;
}

