// The pickers behind "Run Entry…" and "Show Generated Code…", built from the server's backend
// registry (`linnet/backends`), never from a list of our own. Pure (items are structurally QuickPickItems).

import { BackendInfo, GeneratedTarget, RUN_COMMAND, viewTitle } from "./protocol";

export interface BackendPickItem {
  label: string;
  description?: string;
  detail?: string;
  /** The registry name `linnet.run` takes. */
  backend: string;
  available: boolean;
}

/** The backends in the server's order, those that can run here first; one that cannot says why. */
export function backendPickItems(backends: readonly BackendInfo[]): BackendPickItem[] {
  const item = (b: BackendInfo): BackendPickItem => ({
    label: b.label,
    description: b.name,
    detail: b.available ? b.summary || undefined : `cannot run here: ${b.reason ?? "unavailable"}`,
    backend: b.name,
    available: b.available,
  });
  return [...backends.filter((b) => b.available).map(item), ...backends.filter((b) => !b.available).map(item)];
}

export interface CodeViewPickItem {
  label: string;
  description?: string;
  target: GeneratedTarget;
}

/** One item per code view the server's backends have, in their order, with the backends that run it. */
export function codeViewPickItems(backends: readonly BackendInfo[]): CodeViewPickItem[] {
  const users = new Map<string, string[]>();
  for (const b of backends) {
    if (b.codeView) {
      users.set(b.codeView, [...(users.get(b.codeView) ?? []), b.label]);
    }
  }
  return [...users].map(([target, labels]) => ({
    label: viewTitle({ kind: "generated", target }),
    description: labels.join(", "),
    target,
  }));
}

interface LensLike {
  command?: { command?: string; arguments?: unknown[] };
}

/** The entry functions the server's code lenses run (their `linnet.run` arguments), in order, once each. */
export function entriesFromLenses(lenses: readonly LensLike[] | undefined): string[] {
  const entries: string[] = [];
  for (const lens of lenses ?? []) {
    if (lens?.command?.command !== RUN_COMMAND) {
      continue;
    }
    const args = lens.command.arguments?.[0] as { entry?: unknown } | undefined;
    if (typeof args?.entry === "string" && !entries.includes(args.entry)) {
      entries.push(args.entry);
    }
  }
  return entries;
}
