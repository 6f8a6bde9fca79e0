/**
 * The pi harness benchmark (issue 13 item 3): pi's real agent loop (`pi --mode rpc`) driven by a
 * scripted model on loopback through one session of tool calls (session-script.ts), run with the
 * sandbox extension (`sandbox serve`, the default profile and its warm jail) and without any
 * extension (pi's own unsandboxed tools), interleaved by rounds in one run.
 *
 * Each call's time is pi's own: the `durationMs` its agent loop measures around the tool's execute()
 * and reports on `tool_execution_end` (whole milliseconds). Printed beside it, not used for the
 * target: the time between the arrivals of the call's `tool_execution_start` and `tool_execution_end`
 * lines (pi queues its RPC output behind a promise chain, so a start line can leave after the tool's
 * synchronous work: pi's own ls and read then show 0 ms), and for the sandboxed calls the server's
 * own share (its audit records' total_ms). The session's wall time runs from the prompt to
 * `agent_end`, pi and the sandbox already started. Printed per tool: the medians with and without
 * the sandbox, their ratio and whether it meets the target (<= 2.0x); then the session's. Timing
 * never fails the run; a call that errs, results that differ between the two runs, or a session
 * that does not finish do.
 *
 * Usage (from integrations/pi): node --import tsx bench/pi-harness.ts [--rounds 3] [--json FILE]
 * with SANDBOX_BIN naming the sandbox executable (default: the checkout's .venv/bin/sandbox).
 */
import { type ChildProcessWithoutNullStreams, execFileSync, spawn } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { FAKE_MODEL, FAKE_PROVIDER, FakeModel, PI_CLI, piHome } from "../test/fake-model.ts";
import { SANDBOX_BIN, tempDir } from "../test/helpers.ts";
import { CALLS, replies, seedWorkspace, TOOLS, type ToolName } from "./session-script.ts";

const EXTENSION_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const TARGET = 2.0;
const READY_TIMEOUT_MS = 60_000;
const SESSION_TIMEOUT_MS = 300_000;

type Variant = "sandboxed" | "unsandboxed";
type Message = Record<string, unknown>;

interface CallTime {
	tool: string;
	ms: number; // pi's durationMs of the execute() call (whole milliseconds); the events' if pi gives none
	eventMs: number; // tool_execution_start to tool_execution_end, as the lines arrive here
	id: string; // pi's toolCallId
	serverMs?: number; // sandboxed: the server's own time for this call's requests (audit total_ms)
	serverCalls?: number;
	isError: boolean;
	text: string; // the result's text, to check both runs did the same work
}

interface SessionRun {
	variant: Variant;
	round: number;
	readyMs: number; // spawn to ready (pi started; with the extension, its sandbox session open)
	wallMs: number; // prompt to agent_end
	status: string; // the extension's status line, or "pi's own tools"
	calls: CallTime[];
}

/** One `pi --mode rpc` process and the timestamped lines it prints. */
class PiProcess {
	readonly child: ChildProcessWithoutNullStreams;
	private readonly watchers: Array<(message: Message, at: number) => void> = [];
	private stderr = "";

	constructor(cwd: string, env: NodeJS.ProcessEnv, sandboxed: boolean) {
		const extension = sandboxed ? ["-e", EXTENSION_DIR] : [];
		const argv = [PI_CLI, "--mode", "rpc", "--no-session", "--no-extensions", ...extension, "--provider", FAKE_PROVIDER, "--model", FAKE_MODEL, "--tools", TOOLS.join(",")];
		this.child = spawn(process.execPath, argv, { cwd, env });
		this.child.stderr.on("data", (chunk: Buffer) => (this.stderr = (this.stderr + chunk.toString()).slice(-4000)));
		createInterface({ input: this.child.stdout }).on("line", (line) => {
			const at = performance.now();
			let message: Message;
			try {
				message = JSON.parse(line) as Message;
			} catch {
				return;
			}
			for (const watch of this.watchers) watch(message, at);
		});
	}

	watch(watcher: (message: Message, at: number) => void): void {
		this.watchers.push(watcher);
	}

	send(message: Message): void {
		this.child.stdin.write(`${JSON.stringify(message)}\n`);
	}

	/** The first message that `match` accepts, with its arrival time. */
	next(match: (message: Message) => boolean, timeoutMs: number, what: string): Promise<{ message: Message; at: number }> {
		return new Promise((resolve, reject) => {
			const timer = setTimeout(() => reject(new Error(`pi: no ${what} within ${timeoutMs} ms; its stderr: ${this.stderr}`)), timeoutMs);
			this.child.once("exit", (code) => reject(new Error(`pi exited (${code}) before ${what}; its stderr: ${this.stderr}`)));
			this.watch((message, at) => {
				if (!match(message)) return;
				clearTimeout(timer);
				resolve({ message, at });
			});
		});
	}

	async close(): Promise<void> {
		if (this.child.exitCode !== null) return;
		const exited = new Promise((resolve) => this.child.once("exit", resolve));
		this.child.stdin.end();
		const timer = setTimeout(() => this.child.kill("SIGKILL"), 10_000);
		await exited;
		clearTimeout(timer);
	}
}

const isSandboxStatus = (m: Message): boolean => m.type === "extension_ui_request" && m.method === "setStatus" && m.statusKey === "sandbox";

/** Wait until pi answers (and, with the extension, its sandbox session is open): the status line. */
async function ready(pi: PiProcess, sandboxed: boolean): Promise<string> {
	if (!sandboxed) {
		const answer = pi.next((m) => m.type === "response" && m.id === "ready", READY_TIMEOUT_MS, "answer to get_state");
		pi.send({ id: "ready", type: "get_state" });
		await answer;
		return "pi's own tools";
	}
	const { message } = await pi.next(isSandboxStatus, READY_TIMEOUT_MS, "sandbox status line");
	const status = String(message.statusText);
	if (!status.startsWith("sandbox: ") || status.includes("DOWN")) throw new Error(`the sandbox did not start: ${status}`);
	return status;
}

/** Collect each call's start and end, answering any dialog the extension raises (there should be none). */
function timeCalls(pi: PiProcess, dialogs: string[]): CallTime[] {
	const started = new Map<string, number>();
	const calls: CallTime[] = [];
	pi.watch((message, at) => {
		if (message.type === "tool_execution_start") started.set(String(message.toolCallId), at);
		if (message.type === "tool_execution_end") {
			const from = started.get(String(message.toolCallId)) ?? Number.NaN;
			const result = message.result as { content?: Array<{ text?: string }> } | undefined;
			const text = result?.content?.map((c) => c.text ?? "").join("\n") ?? "";
			const duration = message.durationMs;
			const ms = typeof duration === "number" ? duration : at - from;
			calls.push({ tool: String(message.toolName), id: String(message.toolCallId), ms, eventMs: at - from, isError: message.isError === true, text });
		}
		if (message.type === "extension_ui_request" && (message.method === "select" || message.method === "confirm")) {
			dialogs.push(String(message.title));
			pi.send({ type: "extension_ui_response", id: message.id, ...(message.method === "select" ? { value: "Allow for this session" } : { confirmed: true }) });
		}
	});
	return calls;
}

async function runSession(variant: Variant, round: number): Promise<SessionRun> {
	const sandboxed = variant === "sandboxed";
	const workspace = tempDir("pi-bench-ws-");
	const home = tempDir("pi-bench-home-");
	const dataDir = tempDir("pi-bench-data-");
	seedWorkspace(workspace);
	const model = await FakeModel.start(replies());
	piHome(home, model);
	// PI_OFFLINE: pi's own grep and find must use the host's rg and fd, never download them.
	const env: NodeJS.ProcessEnv = { ...process.env, HOME: home, PI_OFFLINE: "1", SANDBOX_BIN, SANDBOX_DATA_DIR: dataDir, SANDBOX_MODE: "auto" };
	for (const name of ["SANDBOX_PROFILE", "SANDBOX_BACKEND", "SANDBOX_MOUNT", "SANDBOX_NETWORK"]) delete env[name];
	const spawned = performance.now();
	const pi = new PiProcess(workspace, env, sandboxed);
	try {
		const status = await ready(pi, sandboxed);
		const readyMs = performance.now() - spawned;
		const dialogs: string[] = [];
		const calls = timeCalls(pi, dialogs);
		const ended = pi.next((m) => m.type === "agent_end", SESSION_TIMEOUT_MS, "agent_end");
		const promptAt = performance.now();
		pi.send({ id: "go", type: "prompt", message: "work through the project" });
		const { at: endAt } = await ended;
		if (dialogs.length > 0) throw new Error(`${variant}: the extension asked ${dialogs.length} question(s) in auto mode: ${dialogs.join(" | ")}`);
		const run = { variant, round, readyMs, wallMs: endAt - promptAt, status, calls };
		await pi.close();
		if (sandboxed) attributeServerTime(run, dataDir);
		return run;
	} finally {
		await pi.close();
		await model.close();
		for (const dir of [workspace, home, dataDir]) rmSync(dir, { recursive: true, force: true });
	}
}

/**
 * How much of each sandboxed call the server spent (its audit records' total_ms: gate, jail and
 * tool); the rest is pi, the extension, the JSON-RPC round trip and the server's work outside the
 * audited span (reading, validating and answering the request). The extension names each
 * server call `<pi's toolCallId>:<n>:<random>`; one pi call may make several (edit: read, then write).
 */
function attributeServerTime(run: SessionRun, dataDir: string): void {
	const env = { ...process.env, SANDBOX_DATA_DIR: dataDir };
	const lines = execFileSync(SANDBOX_BIN, ["audit", "export", "--jsonl"], { env, encoding: "utf8" }).split("\n").filter(Boolean);
	const records = lines.map((line) => JSON.parse(line) as { tool_call_id?: string; total_ms?: number });
	for (const call of run.calls) {
		const own = records.filter((r) => r.tool_call_id?.startsWith(`${call.id}:`));
		call.serverMs = own.reduce((sum, r) => sum + (r.total_ms ?? 0), 0);
		call.serverCalls = own.length;
	}
}

/** A run whose calls failed or went missing times something other than the script: refuse it. */
function check(run: SessionRun): void {
	const failed = run.calls.filter((c) => c.isError);
	if (failed.length > 0) {
		const lines = failed.map((c) => `${c.tool}: ${c.text.slice(0, 300)}`).join("\n  ");
		throw new Error(`${run.variant} round ${run.round}: ${failed.length} call(s) failed:\n  ${lines}`);
	}
	const expected = CALLS.map((c) => c.name).join(",");
	const seen = run.calls.map((c) => c.tool).join(",");
	if (seen !== expected) throw new Error(`${run.variant} round ${run.round}: pi ran ${run.calls.length} calls (${seen}), not the script's ${CALLS.length}`);
}

/** Both runs of a round must have done the same work: the same results, line order aside (rg is parallel). */
function compare(sandboxed: SessionRun, plain: SessionRun): void {
	const lines = (text: string) => text.split("\n").sort().join("\n");
	const differing = CALLS.flatMap((call, index) => {
		const ours = sandboxed.calls[index]?.text ?? "";
		const theirs = plain.calls[index]?.text ?? "";
		return lines(ours) === lines(theirs) ? [] : [`#${index + 1} ${call.name}: sandboxed ${JSON.stringify(ours.slice(0, 200))}, pi's own ${JSON.stringify(theirs.slice(0, 200))}`];
	});
	if (differing.length > 0) throw new Error(`round ${sandboxed.round}: ${differing.length} result(s) differ between the runs:\n  ${differing.join("\n  ")}`);
}

function median(values: number[]): number {
	const sorted = [...values].sort((a, b) => a - b);
	const mid = sorted.length >> 1;
	return sorted.length % 2 ? (sorted[mid] ?? Number.NaN) : ((sorted[mid - 1] ?? Number.NaN) + (sorted[mid] ?? Number.NaN)) / 2;
}

const fmt = (ms: number, width: number): string => ms.toFixed(1).padStart(width);
const verdict = (ratio: number): string => (ratio <= TARGET ? "met" : "not met");

function report(runs: SessionRun[]): void {
	const of = (variant: Variant) => runs.filter((r) => r.variant === variant);
	const calls = (variant: Variant, tool?: ToolName) => of(variant).flatMap((r) => r.calls.filter((c) => !tool || c.tool === tool));
	const statuses = [...new Set(of("sandboxed").map((r) => r.status))];
	console.log(`pi harness: ${of("sandboxed").length} rounds x ${CALLS.length} calls; ${statuses.join("; ")}`);
	console.log("per call: pi's durationMs (its agent loop's timer around execute); events: start to end line arrival;");
	console.log("in serve: the server's audited time for the sandboxed call's requests (total_ms); the rest is the round trip to it");
	console.log(`${"tool".padEnd(8)}${"calls".padStart(6)}${"sandbox ms".padStart(12)}${"pi own ms".padStart(12)}${"ratio".padStart(8)}  ${"target".padEnd(9)}${"events: sandbox".padStart(16)}${"pi own".padStart(8)}${"in serve".padStart(10)}`);
	const row = (label: string, tool?: ToolName) => {
		const [sandboxed, plain] = [calls("sandboxed", tool), calls("unsandboxed", tool)];
		const [ours, theirs] = [median(sandboxed.map((c) => c.ms)), median(plain.map((c) => c.ms))];
		const ratio = ours / theirs;
		const events = `${fmt(median(sandboxed.map((c) => c.eventMs)), 16)}${fmt(median(plain.map((c) => c.eventMs)), 8)}${fmt(median(sandboxed.map((c) => c.serverMs ?? Number.NaN)), 10)}`;
		console.log(`${label.padEnd(8)}${String(sandboxed.length).padStart(6)}${fmt(ours, 12)}${fmt(theirs, 12)}${ratio.toFixed(2).padStart(7)}x  ${verdict(ratio).padEnd(9)}${events}`);
		return ratio <= TARGET;
	};
	const met = TOOLS.map((tool) => row(tool, tool));
	row("all");
	const wall = (variant: Variant) => median(of(variant).map((r) => r.wallMs));
	const toolSum = (variant: Variant) => median(of(variant).map((r) => r.calls.reduce((sum, c) => sum + c.ms, 0)));
	const start = (variant: Variant) => median(of(variant).map((r) => r.readyMs));
	console.log(`session wall (prompt to agent_end), median of rounds: ${wall("sandboxed").toFixed(0)} ms sandboxed, ${wall("unsandboxed").toFixed(0)} ms own tools: ${(wall("sandboxed") / wall("unsandboxed")).toFixed(2)}x`);
	console.log(`  of which in tools: ${toolSum("sandboxed").toFixed(0)} ms sandboxed, ${toolSum("unsandboxed").toFixed(0)} ms own tools: ${(toolSum("sandboxed") / toolSum("unsandboxed")).toFixed(2)}x`);
	console.log(`start-up (spawn to ready, not in the session's time): ${start("sandboxed").toFixed(0)} ms sandboxed, ${start("unsandboxed").toFixed(0)} ms own tools`);
	const missed = TOOLS.filter((_, index) => !met[index]);
	console.log(missed.length === 0 ? "target (every tool <= 2.0x): met" : `target (every tool <= 2.0x): not met for ${missed.join(", ")}`);
}

async function main(): Promise<number> {
	const { values } = parseArgs({ options: { rounds: { type: "string", default: "3" }, json: { type: "string" } } });
	const rounds = Number(values.rounds);
	if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds must be a positive integer, not ${values.rounds}`);
	const runs: SessionRun[] = [];
	for (let round = 0; round < rounds; round++) {
		// Alternate which goes first, so a drift in the machine's load does not favour one side.
		const order: Variant[] = round % 2 === 0 ? ["sandboxed", "unsandboxed"] : ["unsandboxed", "sandboxed"];
		for (const variant of order) {
			const run = await runSession(variant, round);
			check(run);
			runs.push(run);
			console.log(`round ${round + 1}/${rounds} ${variant}: ${run.wallMs.toFixed(0)} ms for ${run.calls.length} calls`);
		}
		const [sandboxed, plain] = ["sandboxed", "unsandboxed"].map((variant) => runs.find((r) => r.round === round && r.variant === variant));
		if (sandboxed && plain) compare(sandboxed, plain);
	}
	if (values.json) writeFileSync(values.json, `${JSON.stringify(runs, null, 2)}\n`);
	report(runs);
	return 0;
}

main().then(
	(code) => process.exit(code),
	(error: unknown) => {
		console.error(`pi harness: ${error instanceof Error ? error.message : String(error)}`);
		process.exit(1);
	},
);
