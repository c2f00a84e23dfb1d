// Linnet's custom LSP requests and the client's commands, as plain data and functions, so that
// params and command tables are unit-tested without VS Code.

import { presetOrNull } from "./settings";

export const SHOW_IR_REQUEST = "linnet/showIR";
export const SHOW_GENERATED_REQUEST = "linnet/showGenerated";
export const PRESETS_REQUEST = "linnet/presets";

/** Commands the server registers through workspace/executeCommand (code lenses invoke them).
 * vscode-languageclient registers these names itself, so the client must not. */
export const SERVER_COMMANDS = ["linnet.run", "linnet.selectPreset"] as const;

export type GeneratedTarget = "torch" | "jax" | "stablehlo" | "onnx";

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

/** Every command the client registers; package.json contributes exactly these. */
export const CLIENT_COMMANDS: readonly string[] = [
  ...SHOW_COMMANDS.map((c) => c.command),
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

const VIEW_SUFFIX: Record<GeneratedTarget | "ir", string> = {
  ir: "ir.txt",
  torch: "torch.py",
  jax: "jax.py",
  stablehlo: "stablehlo.mlir.txt",
  onnx: "onnx.txt",
};

/** The path of the read-only output document: `/gpt2.torch.py` for examples/gpt2.linnet. */
export function outputDocumentPath(sourceUri: string, view: OutputView): string {
  const lastSegment = sourceUri.replace(/[?#].*$/, "").split(/[\\/]/).pop() || "untitled";
  const stem = decodeURIComponentSafe(lastSegment).replace(/\.linnet$/, "");
  const suffix = VIEW_SUFFIX[view.kind === "ir" ? "ir" : view.target];
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
  return { torch: "PyTorch", jax: "JAX", stablehlo: "StableHLO", onnx: "ONNX" }[view.target];
}

