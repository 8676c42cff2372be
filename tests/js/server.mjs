// A chaosllm server for a node test file: `python -m chaosllm serve --port 0` over the
// shipped recordings, its URL read from the line it prints ("chaosllm listening on URL").
import { spawn } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const PYTHON = process.env.CHAOSLLM_PYTHON ?? "python3";

export async function startServer() {
  const child = spawn(PYTHON, ["-m", "chaosllm", "serve", "--port", "0", "-q"], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "inherit"],
  });
  // A test file that ends without `stop()` (a crash, a timeout) still stops its server.
  process.on("exit", () => child.kill("SIGTERM"));
  const url = await new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`no URL from chaosllm: ${out}`)), 30000);
    child.stdout.on("data", (data) => {
      out += data;
      const found = out.match(/chaosllm listening on (\S+)/);
      if (found) {
        clearTimeout(timer);
        resolve(found[1]);
      }
    });
    child.on("exit", (code) => reject(new Error(`chaosllm exited (${code}): ${out}`)));
  });
  return {
    url,
    async arm(fault) {
      const answer = await fetch(`${url}/__fault`, { method: "POST", body: JSON.stringify(fault) });
      if (!answer.ok) throw new Error(`arming ${JSON.stringify(fault)}: ${await answer.text()}`);
    },
    async reset() {
      await fetch(`${url}/__fault`, { method: "DELETE" });
      await fetch(`${url}/__requests`, { method: "DELETE" });
    },
    async requests() {
      const body = await (await fetch(`${url}/__requests`)).json();
      return body.requests ?? body;
    },
    stop() {
      child.kill("SIGTERM");
    },
  };
}

/** The shipped recordings of a provider: [{name, request, response}]. */
export function recordings(provider) {
  const dir = join(ROOT, "recordings");
  const found = [];
  for (const scenario of readdirSync(dir).sort()) {
    for (const file of readdirSync(join(dir, scenario)).sort()) {
      const data = JSON.parse(readFileSync(join(dir, scenario, file), "utf-8"));
      if (data.provider === provider) {
        found.push({ name: `${scenario}/${file.replace(".json", "")}`, ...data });
      }
    }
  }
  return found;
}
