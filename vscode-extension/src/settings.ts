// The `linnet.*` settings and the initializationOptions built from them. Pure: the reader is
// injected (VS Code's WorkspaceConfiguration.get in the extension, a map in the tests).

export const CONFIGURATION_SECTION = "linnet";

/** Reads one key of the `linnet` section, e.g. `inlayHints.shapes`. */
export type SettingReader = <T>(key: string, fallback: T) => T;

export interface LinnetSettings {
  interpreter: string;
  preset: string;
  inlayHints: { shapes: boolean; maxLength: number; parameters: boolean };
}

// Keep in step with contributes.configuration in package.json (a unit test compares them).
export const DEFAULT_SETTINGS: LinnetSettings = {
  interpreter: "",
  preset: "",
  inlayHints: { shapes: true, maxLength: 40, parameters: false },
};

export function readSettings(get: SettingReader): LinnetSettings {
  const maxLength = get<number>("inlayHints.maxLength", DEFAULT_SETTINGS.inlayHints.maxLength);
  return {
    interpreter: get<string>("interpreter", DEFAULT_SETTINGS.interpreter) ?? "",
    preset: get<string>("preset", DEFAULT_SETTINGS.preset) ?? "",
    inlayHints: {
      shapes: get<boolean>("inlayHints.shapes", DEFAULT_SETTINGS.inlayHints.shapes) !== false,
      // A hand-edited settings.json can hold anything; the server should not get NaN or 0.
      maxLength:
        Number.isFinite(maxLength) && maxLength >= 1
          ? Math.floor(maxLength)
          : DEFAULT_SETTINGS.inlayHints.maxLength,
      parameters: get<boolean>("inlayHints.parameters", DEFAULT_SETTINGS.inlayHints.parameters) === true,
    },
  };
}

/** `""` (the setting's default) means automatic (each file's first preset); requests carry that as `null`. */
export function presetOrNull(preset: string | undefined | null): string | null {
  const trimmed = preset?.trim();
  return trimmed ? trimmed : null;
}

export interface InitializationOptions {
  preset: string | null;
  inlayHints: { shapes: boolean; maxLength: number; parameters: boolean };
}

/** What the server gets in `initialize`; later changes arrive as didChangeConfiguration. */
export function initializationOptions(settings: LinnetSettings): InitializationOptions {
  return {
    preset: presetOrNull(settings.preset),
    inlayHints: { ...settings.inlayHints },
  };
}
