import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  EnvironmentPath,
  InterpreterInputs,
  PythonEnvironmentsApi,
  ResolvedEnvironment,
  SERVER_ARGS,
  looksLikePythonExecutable,
  resolveInterpreter,
} from "../../src/interpreter";

function pythonApi(
  active: EnvironmentPath | undefined,
  resolve: (env: EnvironmentPath | string) => Promise<ResolvedEnvironment | undefined>,
): PythonEnvironmentsApi {
  return { getActiveEnvironmentPath: () => active, resolveEnvironment: resolve };
}

function inputs(overrides: Partial<InterpreterInputs>): InterpreterInputs {
  return {
    configured: "",
    platform: "linux",
    pythonEnvironments: async () => undefined,
    ...overrides,
  };
}

const venvPython = "/work/project/.venv/bin/python";

describe("resolveInterpreter", () => {
  it("prefers the linnet.interpreter setting over the Python extension", async () => {
    let asked = false;
    const result = await resolveInterpreter(
      inputs({
        configured: "/opt/py/bin/python3.11",
        pythonEnvironments: async () => {
          asked = true;
          return undefined;
        },
      }),
    );
    assert.deepEqual(result, { command: "/opt/py/bin/python3.11", source: "setting" });
    assert.equal(asked, false, "the Python extension is not activated when the setting decides");
  });

  it("uses the setting as written, so the server's run workers get the same command", async () => {
    const result = await resolveInterpreter(inputs({ configured: " .venv/bin/python " }));
    assert.deepEqual(result, { command: ".venv/bin/python", source: "setting" });
  });

  it("treats a blank setting as unset", async () => {
    const result = await resolveInterpreter(inputs({ configured: "   " }));
    assert.deepEqual(result, { command: "python3", source: "default" });
  });

  it("uses the Python extension's resolved executable", async () => {
    const seen: unknown[] = [];
    const api: PythonEnvironmentsApi = {
      getActiveEnvironmentPath: (resource) => {
        seen.push(resource);
        return { id: "conda-env", path: "/opt/conda/envs/linnet" };
      },
      resolveEnvironment: async () => ({ executable: { uri: { fsPath: "/opt/conda/envs/linnet/bin/python" } } }),
    };
    const result = await resolveInterpreter(inputs({ pythonEnvironments: async () => api, resource: "folder-uri" }));
    assert.deepEqual(result, { command: "/opt/conda/envs/linnet/bin/python", source: "python-extension" });
    assert.deepEqual(seen, ["folder-uri"]);
  });

  it("accepts an asynchronous getActiveEnvironmentPath", async () => {
    const api: PythonEnvironmentsApi = {
      getActiveEnvironmentPath: async () => ({ id: venvPython, path: venvPython }),
      resolveEnvironment: async () => ({ executable: { uri: { fsPath: venvPython } } }),
    };
    const result = await resolveInterpreter(inputs({ pythonEnvironments: async () => api }));
    assert.equal(result.command, venvPython);
  });

  it("falls back to the environment path when it is an interpreter that cannot be resolved", async () => {
    const api = pythonApi({ id: venvPython, path: venvPython }, async () => {
      throw new Error("resolver crashed");
    });
    const logged: string[] = [];
    const result = await resolveInterpreter(inputs({ pythonEnvironments: async () => api, log: (m) => logged.push(m) }));
    assert.deepEqual(result, { command: venvPython, source: "python-extension" });
    assert.equal(logged.length, 1);
  });

  it("ignores an unresolvable environment folder", async () => {
    const api = pythonApi({ id: "x", path: "/opt/conda/envs/linnet" }, async () => ({ executable: {} }));
    const result = await resolveInterpreter(inputs({ pythonEnvironments: async () => api }));
    assert.deepEqual(result, { command: "python3", source: "default" });
  });

  it("tolerates a missing or failing Python extension", async () => {
    assert.equal((await resolveInterpreter(inputs({}))).source, "default");
    const failing = await resolveInterpreter(
      inputs({
        pythonEnvironments: async () => {
          throw new Error("activation failed");
        },
      }),
    );
    assert.deepEqual(failing, { command: "python3", source: "default" });
    const noActive = await resolveInterpreter(
      inputs({ pythonEnvironments: async () => pythonApi(undefined, async () => undefined) }),
    );
    assert.equal(noActive.source, "default");
  });

  it("defaults to python on Windows and python3 elsewhere", async () => {
    assert.equal((await resolveInterpreter(inputs({ platform: "win32" }))).command, "python");
    assert.equal((await resolveInterpreter(inputs({ platform: "darwin" }))).command, "python3");
  });

  it("runs the server as `-m linnet lsp`", () => {
    assert.deepEqual([...SERVER_ARGS], ["-m", "linnet", "lsp"]);
  });
});

describe("looksLikePythonExecutable", () => {
  for (const path of [venvPython, "/usr/bin/python3", "/usr/bin/python3.11", "C:\\envs\\l\\Scripts\\python.exe", "python"]) {
    it(`accepts ${path}`, () => assert.equal(looksLikePythonExecutable(path), true));
  }
  for (const path of ["/opt/conda/envs/linnet", "/usr/bin/python3-config", "/home/u/pythonista"]) {
    it(`rejects ${path}`, () => assert.equal(looksLikePythonExecutable(path), false));
  }
});
