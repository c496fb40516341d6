// TypeScript half of `cargo xtask codegen-check`.
//
// Usage: tsx ts/check.ts <work dir>   (the work dir holds manifest.json, written by the xtask)
//
// 1. Generates one .ts module per fixture kind from its schema with json-schema-to-typescript.
// 2. Writes one .ts file per fixture, `const value: <Root> = <fixture JSON>;`, and type-checks all
//    of them with `tsc --strict`: the fixture must be assignable to the generated type, which
//    fails when the generated type lost a union member, an enum value or a required field.
// 3. At run time, parses each fixture with a type guard backed by ajv (draft 2020-12) compiled
//    from the same schema, serialises the typed value back and compares it with the original.
// 4. Type-checks every mutation of the fixture that the structural part of the schema rejects
//    (probes-ts.json, written by the xtask): each must be a tsc error, or the generated type is
//    looser than the schema.
//
// Writes <work dir>/ts-results.json: {"<fixture>": {"ok": bool, "detail": string}}.

import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { compile } from "json-schema-to-typescript";
import { Ajv2020 } from "ajv/dist/2020.js";
import type { ValidateFunction } from "ajv";

import { jsonEqual } from "./json_equal.js";

interface KindEntry {
  id: string;
  root: string;
  schema: string;
}
interface FixtureEntry {
  name: string;
  kind: string;
  path: string;
}
interface Manifest {
  kinds: KindEntry[];
  fixtures: FixtureEntry[];
}
interface Probe {
  fixture: string;
  kind: string;
  id: number;
  what: string;
  document: unknown;
}
interface Result {
  ok: boolean;
  detail: string;
}

const here = dirname(fileURLToPath(import.meta.url));
const codegenDir = resolve(here, "..");

function moduleName(kind: string): string {
  return kind.replace(/[^A-Za-z0-9_]/g, "_");
}

function fixtureModule(name: string): string {
  return name.replace(/[^A-Za-z0-9_]/g, "_");
}

/** Formats our schemas use beyond the standard ones (schemars' integer and float widths). */
function addFormats(ajv: Ajv2020): void {
  ajv.addFormat("uint64", {
    type: "number",
    validate: (n: number) => Number.isInteger(n) && n >= 0,
  });
  ajv.addFormat("uint32", {
    type: "number",
    validate: (n: number) => Number.isInteger(n) && n >= 0 && n <= 0xffffffff,
  });
  ajv.addFormat("double", { type: "number", validate: () => true });
}

/** A type guard: the value is a `T` when the schema `T` was generated from accepts it. */
function guard<T>(validate: ValidateFunction): (value: unknown) => value is T {
  return (value: unknown): value is T => validate(value) === true;
}

async function main(): Promise<number> {
  const work = process.argv[2];
  if (!work) {
    console.error("usage: tsx ts/check.ts <work dir>");
    return 2;
  }
  const manifest = JSON.parse(readFileSync(join(work, "manifest.json"), "utf8")) as Manifest;
  const out = join(work, "ts");
  rmSync(out, { recursive: true, force: true });
  mkdirSync(join(out, "types"), { recursive: true });
  mkdirSync(join(out, "fixtures"), { recursive: true });
  mkdirSync(join(out, "probes"), { recursive: true });
  const probes = JSON.parse(readFileSync(join(work, "probes-ts.json"), "utf8")) as Probe[];

  const results: Record<string, Result> = {};
  const kindError: Record<string, string> = {};
  const validators: Record<string, ValidateFunction> = {};

  // 1. Generate types, and compile a runtime validator from the same schema.
  for (const kind of manifest.kinds) {
    const schema = JSON.parse(readFileSync(kind.schema, "utf8"));
    try {
      const ts = await compile(schema, kind.root, {
        bannerComment: `// Generated from ${relative(work, kind.schema)} by json-schema-to-typescript. Do not edit.`,
        additionalProperties: true,
        unreachableDefinitions: true,
        strictIndexSignatures: false,
        format: false,
        cwd: dirname(kind.schema),
      });
      writeFileSync(join(out, "types", `${moduleName(kind.id)}.ts`), ts);
    } catch (error) {
      kindError[kind.id] = `json-schema-to-typescript failed: ${String(error)}`;
      continue;
    }
    try {
      const ajv = new Ajv2020({ strict: true, strictTypes: false, strictTuples: false, strictRequired: false, allErrors: true });
      addFormats(ajv);
      validators[kind.id] = ajv.compile(schema);
    } catch (error) {
      kindError[kind.id] = `ajv could not compile the schema: ${String(error)}`;
    }
  }

  // 2. One typed module per fixture.
  for (const fixture of manifest.fixtures) {
    const kind = manifest.kinds.find((k) => k.id === fixture.kind);
    if (!kind || kindError[fixture.kind]) {
      continue;
    }
    const text = readFileSync(fixture.path, "utf8");
    const source =
      `// ${fixture.name}: must be assignable to the generated ${kind.root}.\n` +
      `import type { ${kind.root} } from "../types/${moduleName(kind.id)}.js";\n` +
      `export const value: ${kind.root} = ${text.trim()};\n`;
    writeFileSync(join(out, "fixtures", `${fixtureModule(fixture.name)}.ts`), source);
  }
  // Mutations the schema's structure rejects: each must be a type error.
  const probeFiles = new Map<Probe, string>();
  for (const probe of probes) {
    const kind = manifest.kinds.find((k) => k.id === probe.kind);
    if (!kind || kindError[probe.kind]) {
      continue;
    }
    const file = resolve(out, "probes", `${fixtureModule(probe.fixture)}__${probe.id}.ts`);
    const source =
      `// ${probe.fixture}, ${probe.what}: the generated ${kind.root} must reject this.\n` +
      `import type { ${kind.root} } from "../types/${moduleName(kind.id)}.js";\n` +
      `export const value: ${kind.root} = ${JSON.stringify(probe.document, null, 1)};\n`;
    writeFileSync(file, source);
    probeFiles.set(probe, file);
  }
  writeFileSync(
    join(out, "tsconfig.json"),
    JSON.stringify(
      {
        compilerOptions: {
          strict: true,
          noEmit: true,
          target: "ES2022",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          exactOptionalPropertyTypes: true,
          noUncheckedIndexedAccess: true,
          skipLibCheck: true,
          types: [],
        },
        include: ["types/*.ts", "fixtures/*.ts", "probes/*.ts"],
      },
      null,
      2,
    ),
  );

  // tsc --strict over everything at once; errors are attributed to the file they are in.
  const typeErrors: Record<string, string[]> = {};
  const tsc = join(codegenDir, "node_modules", "typescript", "bin", "tsc");
  try {
    execFileSync(process.execPath, [tsc, "-p", join(out, "tsconfig.json"), "--pretty", "false"], {
      encoding: "utf8",
      maxBuffer: 512 * 1024 * 1024,
      cwd: out,
      stdio: ["ignore", "pipe", "pipe"],
    });
  } catch (error) {
    const output = String((error as { stdout?: string }).stdout ?? "") + String((error as { stderr?: string }).stderr ?? "");
    let current: string | undefined;
    for (const line of output.split("\n")) {
      const match = /^(.*?\.ts)\(\d+,\d+\): error/.exec(line);
      if (match && match[1]) {
        current = resolve(out, match[1]);
        (typeErrors[current] ??= []).push(line);
      } else if (current && line.startsWith(" ")) {
        typeErrors[current]?.push(line);
      } else if (line.trim() && !match) {
        (typeErrors["(tsc)"] ??= []).push(line);
      }
    }
    if (Object.keys(typeErrors).length === 0) {
      typeErrors["(tsc)"] = [output || String(error)];
    }
  }
  if (typeErrors["(tsc)"]) {
    console.error(typeErrors["(tsc)"].join("\n"));
  }

  // 3. Runtime round trip.
  for (const fixture of manifest.fixtures) {
    const problems: string[] = [];
    const kind = manifest.kinds.find((k) => k.id === fixture.kind);
    if (!kind) {
      problems.push(`no schema for kind ${fixture.kind}`);
    } else if (kindError[fixture.kind]) {
      problems.push(kindError[fixture.kind] ?? "");
    } else {
      const typesFile = resolve(out, "types", `${moduleName(kind.id)}.ts`);
      const fixtureFile = resolve(out, "fixtures", `${fixtureModule(fixture.name)}.ts`);
      for (const file of [typesFile, fixtureFile]) {
        const errors = typeErrors[file];
        if (errors) {
          problems.push(`tsc --strict: ${errors.join(" ").slice(0, 800)}`);
        }
      }
      if (typeErrors["(tsc)"]) {
        problems.push("tsc failed (see above)");
      }
      const validate = validators[kind.id];
      if (validate) {
        const text = readFileSync(fixture.path, "utf8");
        const original: unknown = JSON.parse(text);
        const isRoot = guard<unknown>(validate);
        const parsed: unknown = JSON.parse(text);
        if (!isRoot(parsed)) {
          problems.push(`runtime validation: ${JSON.stringify(validate.errors).slice(0, 800)}`);
        } else {
          const back: unknown = JSON.parse(JSON.stringify(parsed));
          const difference = jsonEqual(original, back, "");
          if (difference) {
            problems.push(`round trip changed the document: ${difference}`);
          }
        }
      }
    }
    const accepted = [...probeFiles.entries()].filter(
      ([probe, file]) => probe.fixture === fixture.name && !typeErrors[file],
    );
    if (accepted.length > 0) {
      const examples = accepted.slice(0, 5).map(([probe]) => probe.what).join(", ");
      problems.push(
        `the generated type is looser than the schema: it accepts ${accepted.length} document(s) the schema rejects (${examples})`,
      );
    }
    results[fixture.name] = { ok: problems.length === 0, detail: problems.join("; ") };
  }

  writeFileSync(join(work, "ts-results.json"), JSON.stringify(results, null, 2));
  const failed = Object.values(results).filter((r) => !r.ok).length;
  console.log(
    `TypeScript: ${manifest.fixtures.length - failed}/${manifest.fixtures.length} fixtures pass ` +
      `(${probeFiles.size} mutations the schema rejects checked to be type errors)`,
  );
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error);
    process.exit(2);
  },
);
