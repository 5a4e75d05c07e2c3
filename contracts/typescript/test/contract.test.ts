// Node-side contract checks: every JSON Schema compiles under Ajv 8 (2020-12 dialect, strict mode), the
// contract's example messages validate, and the AsyncAPI document parses with the official parser with no
// error diagnostics. These are the checks a TypeScript toolchain would run on contracts/schemas.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { Parser, DiagnosticSeverity } from "@asyncapi/parser";
import { Ajv2020 } from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";

import { createLongTermMemoryTool, type CreateMemoryArguments } from "../src/index.js";
import { PACKAGE_ROOT } from "./harness.js";

const SCHEMAS = join(PACKAGE_ROOT, "../schemas");
// the message schemas (`*.v1.json`); the model's tool declaration (`*.tool.json`) has its own test below
const schemaFiles = readdirSync(SCHEMAS).filter((f) => /\.v\d+\.json$/.test(f) && !f.startsWith("asyncapi"));
// ajv-formats is CommonJS with a default export
const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;

function load(file: string): Record<string, unknown> {
  return JSON.parse(readFileSync(join(SCHEMAS, file), "utf8")) as Record<string, unknown>;
}

function strictAjv(): Ajv2020 {
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  addFormats(ajv);
  return ajv;
}

for (const file of schemaFiles) {
  test(`${file} compiles under Ajv 2020 strict`, () => {
    const ajv = strictAjv();
    assert.doesNotThrow(() => ajv.compile(load(file)));
  });
}

const examples = JSON.parse(readFileSync(join(PACKAGE_ROOT, "test/fixtures/contract-examples.json"), "utf8")) as Record<string, unknown[]>;

for (const [file, messages] of Object.entries(examples)) {
  test(`CONTRACT.md's example messages validate against ${file}`, () => {
    const schema = load(file);
    const validate = strictAjv().compile(schema);
    // the schema's own examples, where it has some, count too
    const own = Array.isArray(schema.examples) ? schema.examples : [];
    for (const message of [...messages, ...own]) {
      assert.ok(validate(message), `${JSON.stringify(validate.errors)} for ${JSON.stringify(message).slice(0, 200)}`);
    }
  });
}

test("a message that breaks the contract does not validate (the checks can fail)", () => {
  const validate = strictAjv().compile(load("tool_call_event.v1.json"));
  const [event] = examples["tool_call_event.v1.json"] as Array<Record<string, unknown>>;
  assert.ok(validate(event));
  assert.equal(validate({ ...event, tool_name: "delete_everything" }), false);
  assert.equal(validate({ ...event, event_id: 42 }), false);
  const { context: _dropped, ...withoutContext } = event as Record<string, unknown>;
  assert.equal(validate(withoutContext), false);
});

test("every message schema has CONTRACT.md examples here", () => {
  const covered = new Set(Object.keys(examples));
  const messages = schemaFiles.filter((f) => !f.startsWith("dead_letter"));
  assert.deepEqual(messages.filter((f) => !covered.has(f)), []);
});

test("asyncapi.v3.json parses with @asyncapi/parser without error diagnostics", async () => {
  const parser = new Parser();
  const text = readFileSync(join(SCHEMAS, "asyncapi.v3.json"), "utf8");
  // the document $refs the message schemas beside it: the source path resolves them
  const { document, diagnostics } = await parser.parse(text, { source: join(SCHEMAS, "asyncapi.v3.json") });
  const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
  assert.deepEqual(
    errors.map((d) => `${d.path.join(".")}: ${d.message}`),
    [],
  );
  assert.ok(document, "the parser returned a document");
  assert.ok(document.channels().length >= 4, "channels of the contract");
});

test("the model's tool declaration: its parameters compile under Ajv 2020 strict and take the arguments a shard sends", () => {
  const declared = load("create_long_term_memory.tool.json") as {
    name: string;
    parameters: Record<string, unknown>;
  };
  assert.equal(declared.name, createLongTermMemoryTool.name);
  assert.deepEqual(createLongTermMemoryTool, declared); // the kit's constant is the generated file
  const parameters = strictAjv().compile(declared.parameters);
  const argumentsSchema = strictAjv().compile(load("create_memory_arguments.v1.json"));
  const serverWide: CreateMemoryArguments = { memory_content: "{user} likes dogs", memory_scope: "server_wide" };
  const personal: CreateMemoryArguments = {
    memory_content: "{user} prefers tea",
    memory_scope: "target_user",
    target_user: "Sparrow",
  };
  for (const args of [serverWide, personal]) {
    assert.ok(parameters(args), JSON.stringify(parameters.errors));
    assert.ok(argumentsSchema(args), JSON.stringify(argumentsSchema.errors));
  }
  assert.equal(parameters({ memory_content: "x", memory_scope: "everywhere" }), false);
  assert.equal(argumentsSchema({ memory_scope: "server_wide" }), false);
  // every parameter the model is shown is a key of the arguments type, with the same description
  const argProps = (load("create_memory_arguments.v1.json").properties ?? {}) as Record<string, { description: string }>;
  const toolProps = (declared.parameters.properties ?? {}) as Record<string, { description: string }>;
  for (const [key, prop] of Object.entries(toolProps)) assert.equal(argProps[key]?.description, prop.description, key);
});
