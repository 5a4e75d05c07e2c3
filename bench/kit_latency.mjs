// The TypeScript kit's side of `python -m bench latency`: one LtmClient offers createMemory calls open-loop
// at a fixed rate and prints each call's latency, from its scheduled send time to its result (so a slow
// answer does not delay the next call: no coordinated omission). The built kit (contracts/typescript/dist)
// is imported as a shard would; the AMQP URL comes from LTM_RABBITMQ_URL, the context from
// LTM_BENCH_CONTEXT. LTM_BENCH_NAGLE=1 turns Nagle's algorithm back on for every socket (what the kit did
// before it set noDelay), to measure what it costs.
import net from "node:net";
import { performance } from "node:perf_hooks";

const [rate, seconds, shardId, minCalls] = process.argv.slice(2).map(Number);
if (process.env.LTM_BENCH_NAGLE === "1") {
  const original = net.Socket.prototype.setNoDelay;
  net.Socket.prototype.setNoDelay = function () {
    return original.call(this, false);
  };
}
const { LtmClient } = await import(new URL("../contracts/typescript/dist/index.js", import.meta.url).href);
const context = JSON.parse(process.env.LTM_BENCH_CONTEXT);
const quiet = { debug() {}, info() {}, warn: (m, f) => console.error(m, f ?? ""), error: (m, f) => console.error(m, f ?? "") };
const client = await LtmClient.connect({ url: process.env.LTM_RABBITMQ_URL, shardId, logger: quiet, timeoutMs: 60_000 });

let n = 0;
const call = () => {
  n += 1;
  return client.createMemory({
    toolCallId: `call_kit_${process.pid}_${n}`,
    arguments: { memory_content: `{user} likes kit item ${n}`, memory_scope: "server_wide" },
    context,
  });
};
// a few calls first, one at a time: connections warm, JIT compiled
for (let i = 0; i < 5; i += 1) await call();

const count = Math.max(minCalls || 0, Math.round(rate * seconds));
const latencies = [];
const statuses = {};
let errors = 0;
const cpuBefore = process.cpuUsage();
const start = performance.now() + 20;
const calls = [];
for (let i = 0; i < count; i += 1) {
  const at = start + (i * 1000) / rate;
  const wait = at - performance.now();
  if (wait > 0) await new Promise((done) => setTimeout(done, wait));
  calls.push(
    call().then(
      (result) => {
        latencies.push(performance.now() - at);
        statuses[result.status] = (statuses[result.status] ?? 0) + 1;
      },
      (error) => {
        errors += 1;
        console.error(String(error));
      },
    ),
  );
}
await Promise.all(calls);
const cpu = process.cpuUsage(cpuBefore);
await client.close();
const shardCpuMsPerCall = (cpu.user + cpu.system) / 1000 / count;
process.stdout.write(JSON.stringify({ latencies_ms: latencies, statuses, errors, shard_cpu_ms_per_call: shardCpuMsPerCall }) + "\n");
