// Which Python runs the language server. Pure: everything it needs is passed in, so the unit
// tests can exercise every branch without VS Code or the Python extension.

/** The slice of the Python extension's `exports.environments` API that we use. */
export interface PythonEnvironmentsApi {
  getActiveEnvironmentPath(resource?: unknown): EnvironmentPath | undefined | Promise<EnvironmentPath | undefined>;
  resolveEnvironment(environment: EnvironmentPath | string): Promise<ResolvedEnvironment | undefined>;
}

export interface EnvironmentPath {
  id: string;
  path: string;
}

export interface ResolvedEnvironment {
  executable?: { uri?: { fsPath: string } };
}

export interface InterpreterInputs {
  /** The `linnet.interpreter` setting; empty or blank means "not set". It is used as written,
   * because the server gets the same setting for its run workers (a relative path resolves
   * against the workspace folder, the working directory of both). */
  configured: string | undefined;
  platform: NodeJS.Platform;
  /** Resolves to the Python extension's environments API, or undefined when it is absent. */
  pythonEnvironments: () => Promise<PythonEnvironmentsApi | undefined>;
  /** The document the server is for; the Python extension picks its environment per resource. */
  resource?: unknown;
  /** Called with what went wrong when the Python extension could not give an interpreter. */
  log?: (message: string) => void;
}

export type InterpreterSource = "setting" | "python-extension" | "default";

export interface ResolvedInterpreter {
  command: string;
  source: InterpreterSource;
}

/** `<python> -m linnet lsp` speaks LSP on stdio. */
export const SERVER_ARGS: readonly string[] = ["-m", "linnet", "lsp"];

export function defaultInterpreter(platform: NodeJS.Platform): string {
  return platform === "win32" ? "python" : "python3";
}

// An environment path may be the interpreter itself (venvs, system Pythons) or the
// environment's folder (conda); only the former can be run directly.
const PYTHON_EXECUTABLE = /(^|[\\/])python(\d+(\.\d+)*)?(\.exe)?$/i;

export function looksLikePythonExecutable(path: string): boolean {
  return PYTHON_EXECUTABLE.test(path);
}

async function fromPythonExtension(inputs: InterpreterInputs): Promise<string | undefined> {
  try {
    const api = await inputs.pythonEnvironments();
    if (!api) {
      return undefined;
    }
    const active = await api.getActiveEnvironmentPath(inputs.resource);
    if (!active || !active.path) {
      return undefined;
    }
    try {
      const resolved = await api.resolveEnvironment(active);
      const executable = resolved?.executable?.uri?.fsPath;
      if (executable) {
        return executable;
      }
    } catch (error) {
      inputs.log?.(`Python extension could not resolve ${active.path}: ${String(error)}`);
    }
    return looksLikePythonExecutable(active.path) ? active.path : undefined;
  } catch (error) {
    inputs.log?.(`Python extension gave no active environment: ${String(error)}`);
    return undefined;
  }
}

/** The setting if set, else the Python extension's active environment, else the platform default. */
export async function resolveInterpreter(inputs: InterpreterInputs): Promise<ResolvedInterpreter> {
  const configured = inputs.configured?.trim();
  if (configured) {
    return { command: configured, source: "setting" };
  }
  const fromExtension = await fromPythonExtension(inputs);
  if (fromExtension) {
    return { command: fromExtension, source: "python-extension" };
  }
  return { command: defaultInterpreter(inputs.platform), source: "default" };
}
