// Semantic JSON equality: member order is ignored, everything else must match exactly.

/** Returns undefined when `a` and `b` are the same JSON value, else where and how they differ. */
export function jsonEqual(a: unknown, b: unknown, path: string): string | undefined {
  const at = path === "" ? "/" : path;
  if (a === null || b === null || typeof a !== "object" || typeof b !== "object") {
    return Object.is(a, b) || a === b ? undefined : `${at}: ${JSON.stringify(a)} became ${JSON.stringify(b)}`;
  }
  if (Array.isArray(a) !== Array.isArray(b)) {
    return `${at}: array and object differ`;
  }
  if (Array.isArray(a) && Array.isArray(b)) {
    if (a.length !== b.length) {
      return `${at}: ${a.length} items became ${b.length}`;
    }
    for (let i = 0; i < a.length; i++) {
      const difference = jsonEqual(a[i], b[i], `${path}/${i}`);
      if (difference) {
        return difference;
      }
    }
    return undefined;
  }
  const left = a as Record<string, unknown>;
  const right = b as Record<string, unknown>;
  const keys = new Set([...Object.keys(left), ...Object.keys(right)]);
  for (const key of keys) {
    if (!(key in left)) {
      return `${path}/${key}: added`;
    }
    if (!(key in right)) {
      return `${path}/${key}: dropped`;
    }
    const difference = jsonEqual(left[key], right[key], `${path}/${key}`);
    if (difference) {
      return difference;
    }
  }
  return undefined;
}
