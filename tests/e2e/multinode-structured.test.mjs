// Structured outputs on instances of several nodes: a pipeline's last stage samples in another
// process than the one holding the request, so it must rebuild each request's grammar and mask
// with it there; tensor parallel samples on rank 0. On a random-weight model any token is
// possible, so only the mask makes a reply valid JSON. The same constrained requests (OpenAI
// response_format json_schema, greedy, sent concurrently so the constrained sequences share
// batches) on 1 node, a 2-node pipeline and a 2-node tensor instance must each return JSON that
// ajv validates against its schema, and the same reply on every split. A forced tool call and a
// GBNF grammar ride along. The cluster runs the exact kernels and an f32 KV cache (as
// multinode-equivalence does), where the splits compute the one-node logits (pipeline bit for
// bit, tensor within 1.1e-5), so greedy replies match token for token.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import Ajv2020 from 'ajv/dist/2020.js';
import { mkModel } from './lib/models.mjs';
import { DIST_MODELS, eachSplit, httpAsync, startCluster } from './lib/multinode.mjs';

const MODEL = 'qwen3-dist';
const SPLITS = [['Pipeline', 1], ['Pipeline', 2], ['Tensor', 2]];
const ask = [{ role: 'user', content: 'Fill in the record.' }];
const ajv = new Ajv2020({ strict: false, allErrors: true });

// Bounded (a random model would write an unbounded string forever), and varied: enums, integer
// ranges, arrays, nesting, optional members, anyOf.
const SCHEMAS = [
  { type: 'object', properties: { name: { type: 'string', maxLength: 6 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'], additionalProperties: false },
  { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] }, ok: { type: 'boolean' } },
    required: ['color', 'ok'] },
  { type: 'object', properties: { tags: { type: 'array', items: { type: 'string', maxLength: 4 }, minItems: 1, maxItems: 3 } },
    required: ['tags'], additionalProperties: false },
  { type: 'object', properties: { point: { type: 'object', properties: { x: { type: 'number', minimum: -5, maximum: 5 }, y: { type: 'integer' } },
    required: ['x', 'y'], additionalProperties: false }, label: { anyOf: [{ type: 'null' }, { type: 'string', maxLength: 3 }] } },
  required: ['point', 'label'], additionalProperties: false },
];

let c;
before(async () => {
  const dir = await mkModel(MODEL, DIST_MODELS[MODEL]);
  c = await startCluster(2, path.dirname(dir), { EXO_CPU_SIMD: 'avx2', EXO_Q4_LAYOUT: 'mlx' },
    { nodeArgs: ['--kv-cache-dtype', 'f32'] });
});
after(async () => { await c?.stop(); });

async function chat(node, extra) {
  const r = await httpAsync(c, node, 'POST', '/v1/chat/completions',
    { model: MODEL, messages: ask, max_tokens: 300, temperature: 0, ...extra }, 180);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body.choices[0];
}

// Every request of one split, all at once.
function askAll(node) {
  return Promise.all([
    ...SCHEMAS.map((schema) => chat(node,
      { response_format: { type: 'json_schema', json_schema: { name: 'record', schema, strict: true } } })),
    chat(node, { tools: [{ type: 'function', function: { name: 'store', parameters: SCHEMAS[0] } }],
      tool_choice: { type: 'function', function: { name: 'store' } } }),
    chat(node, { grammar: 'root ::= ("yes" | "no") " " [0-9]{2} "!"' }),
  ]);
}

function check(replies, what) {
  SCHEMAS.forEach((schema, i) => {
    const choice = replies[i];
    assert.equal(choice.finish_reason, 'stop', `${what} schema ${i}: finished by ${choice.finish_reason}`);
    const validate = ajv.compile(schema);
    const value = JSON.parse(choice.message.content);
    assert.ok(validate(value), `${what} schema ${i}: ${choice.message.content}: ${ajv.errorsText(validate.errors)}`);
  });
  const call = replies[SCHEMAS.length].message.tool_calls;
  assert.equal(call.length, 1, `${what}: one forced tool call`);
  assert.equal(call[0].function.name, 'store');
  assert.ok(ajv.compile(SCHEMAS[0])(JSON.parse(call[0].function.arguments)), `${what}: tool arguments`);
  assert.match(replies[SCHEMAS.length + 1].message.content, /^(yes|no) [0-9]{2}!$/, `${what}: grammar`);
}

const summary = (replies) => replies.map((r) => r.message.content ?? JSON.stringify(r.message.tool_calls.map((t) => t.function)));

test('json_schema, forced tool call and grammar on 1 node = pipeline x2 = tensor x2 (valid, same replies)', async () => {
  const [a, b] = c.nodes;
  const [reference, ...others] = await eachSplit(c, a, b, MODEL, SPLITS, async ({ what, via }) => {
    const replies = await askAll(via);
    check(replies, what);
    return { what, replies: summary(replies) };
  });
  for (const o of others) assert.deepEqual(o.replies, reference.replies, `${o.what}: the one-node replies`);
});
