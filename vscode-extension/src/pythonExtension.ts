// Access to the Python extension (ms-python.python), which may be missing, disabled, or an
// older release without `exports.environments`; every failure reads as "no environment".

import * as vscode from "vscode";
import type { EnvironmentPath, PythonEnvironmentsApi } from "./interpreter";

const PYTHON_EXTENSION_ID = "ms-python.python";

interface PythonEnvironmentsExports extends PythonEnvironmentsApi {
  onDidChangeActiveEnvironmentPath?: vscode.Event<EnvironmentPath & { resource?: unknown }>;
}

async function environmentsExport(): Promise<PythonEnvironmentsExports | undefined> {
  const extension = vscode.extensions.getExtension(PYTHON_EXTENSION_ID);
  if (!extension) {
    return undefined;
  }
  const exported = extension.isActive ? extension.exports : await extension.activate();
  const environments = exported?.environments;
  if (
    environments &&
    typeof environments.getActiveEnvironmentPath === "function" &&
    typeof environments.resolveEnvironment === "function"
  ) {
    return environments as PythonEnvironmentsExports;
  }
  return undefined;
}

export function pythonEnvironments(): Promise<PythonEnvironmentsApi | undefined> {
  return environmentsExport();
}

/** Calls `listener` when the user picks another Python environment; a no-op without the extension. */
export async function onPythonEnvironmentChanged(listener: () => void): Promise<vscode.Disposable> {
  try {
    const environments = await environmentsExport();
    if (environments?.onDidChangeActiveEnvironmentPath) {
      return environments.onDidChangeActiveEnvironmentPath(() => listener());
    }
  } catch {
    // The Python extension failed to activate: nothing to follow.
  }
  return new vscode.Disposable(() => undefined);
}
