// The preset picker's items and the status bar text. Pure (items are structurally QuickPickItems).

export const DEFAULTS_LABEL = "(automatic)";

export interface PresetPickItem {
  label: string;
  description?: string;
  /** The value written to `linnet.preset`; "" selects the automatic choice (the file's first preset). */
  preset: string;
}

/** The automatic choice first, then the file's presets in the server's order, current one marked. */
export function presetPickItems(presets: readonly string[], current: string | undefined): PresetPickItem[] {
  const selected = current?.trim() ?? "";
  const unique = [...new Set(presets.filter((name) => typeof name === "string" && name.trim() !== ""))];
  const items: PresetPickItem[] = [
    { label: DEFAULTS_LABEL, description: "each file's first preset", preset: "" },
    ...unique.map((name) => ({ label: name, preset: name })),
  ];
  for (const item of items) {
    if (item.preset === selected) {
      item.description = item.description ? `${item.description} · current` : "current";
    }
  }
  // A preset set by hand that this file does not declare is still shown, so it can be unset.
  if (selected && !unique.includes(selected)) {
    items.push({ label: selected, description: "current · not declared in this file", preset: selected });
  }
  return items;
}

export function presetStatusText(current: string | undefined): string {
  const selected = current?.trim();
  return `Linnet: ${selected ? selected : "first preset"}`;
}
