/**
 * End to end through pi itself: `pi --mode rpc -e integrations/pi`, its `bash` RPC command (the
 * user's `!command`, which pi routes through the extension's user_bash handler), and the
 * approval dialog answered over pi's RPC extension-UI protocol.
 */
import assert from "node:assert/strict";
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { existsSync, rmSync } from "node:fs";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { FAKE_MODEL, FAKE_PROVIDER, FakeModel, piHome } from "./fake-model.ts";
import { SANDBOX_BIN, tempDir } from "./helpers.ts";

const here = path.dirname(fileURLToPath(import.meta.url));
const extensionDir = path.resolve(here, "..");
const piCli = path.join(extensionDir, "node_modules/@earendil-works/pi-coding-agent/dist/bundle/cli.js");

type Message = Record<string, unknown>;

class PiRpc {
	private readonly child: ChildProcessWithoutNullStreams;
	private readonly waiters: Array<{ match: (m: Message) => boolean; resolve: (m: Message) => void }> = [];
	readonly seen: Message[] = [];
	onUiRequest: (request: Message) => Message | undefined = () => undefined;

	constructor(cwd: string, env: NodeJS.ProcessEnv, flags: string[] = [], options: { keepSession?: boolean } = {}) {
		const session = options.keepSession ? [] : ["--no-session"];
		this.child = spawn(process.execPath, [piCli, "--mode", "rpc", ...session, "--no-extensions", "-e", extensionDir, ...flags], { cwd, env });
		createInterface({ input: this.child.stdout }).on("line", (line) => {
			let message: Message;
			try {
				message = JSON.parse(line) as Message;
			} catch {
				return;
			}
			this.seen.push(message);
			if (message.type === "extension_ui_request") {
				const answer = this.onUiRequest(message);
				if (answer) this.send({ type: "extension_ui_response", id: message.id, ...answer });
			}
			for (const waiter of [...this.waiters]) {
				if (waiter.match(message)) {
					this.waiters.splice(this.waiters.indexOf(waiter), 1);
					waiter.resolve(message);
				}
			}
		});
	}

	send(message: Message): void {
		this.child.stdin.write(`${JSON.stringify(message)}\n`);
	}

	request(message: Message, timeoutMs = 30_000): Promise<Message> {
		const response = new Promise<Message>((resolve, reject) => {
			const timer = setTimeout(() => reject(new Error(`no response to ${JSON.stringify(message)}; saw ${JSON.stringify(this.seen).slice(-1500)}`)), timeoutMs);
			this.waiters.push({
				match: (m) => m.type === "response" && m.id === message.id,
				resolve: (m) => {
					clearTimeout(timer);
					resolve(m);
				},
			});
		});
		this.send(message);
		return response;
	}

	/** The first message, seen already or to come, that `match`es. */
	waitFor(match: (m: Message) => boolean, timeoutMs = 60_000): Promise<Message> {
		const seen = this.seen.find(match);
		if (seen) return Promise.resolve(seen);
		return new Promise<Message>((resolve, reject) => {
			const timer = setTimeout(() => reject(new Error(`not seen in time; saw ${JSON.stringify(this.seen).slice(-1500)}`)), timeoutMs);
			this.waiters.push({
				match,
				resolve: (m) => {
					clearTimeout(timer);
					resolve(m);
				},
			});
		});
	}

	async close(): Promise<void> {
		this.child.stdin.end();
		const exited = new Promise((resolve) => this.child.once("exit", resolve));
		const timer = setTimeout(() => this.child.kill("SIGKILL"), 5000);
		await exited;
		clearTimeout(timer);
	}
}

describe("pi --mode rpc with the extension", () => {
	let workspace: string;
	let home: string;
	let dataDir: string;
	const env = (mode: string): NodeJS.ProcessEnv => ({ ...process.env, HOME: home, SANDBOX_BIN, SANDBOX_DATA_DIR: dataDir, SANDBOX_MODE: mode });
	before(() => {
		workspace = tempDir("pi-sbx-rpc-ws-");
		home = tempDir("pi-sbx-rpc-home-");
		dataDir = tempDir("pi-sbx-rpc-data-");
	});
	after(() => {
		for (const dir of [workspace, home, dataDir]) rmSync(dir, { recursive: true, force: true });
	});

	it("/sandbox plan shows the model no write or edit and says Bash may still write; /sandbox agent gives them back", async () => {
		const model = await FakeModel.start([{ text: "planned" }, { text: "back in agent" }]);
		piHome(home, model);
		const pi = new PiRpc(workspace, env("auto"), ["--provider", FAKE_PROVIDER, "--model", FAKE_MODEL]);
		const notes: string[] = [];
		pi.onUiRequest = (request) => {
			if (request.method === "notify") notes.push(String(request.message));
			return undefined;
		};
		const toolsOf = (request: Record<string, unknown> | undefined): string[] =>
			((request?.tools as Array<{ function: { name: string } }> | undefined) ?? []).map((tool) => tool.function.name).sort();
		const ended = (n: number) => () => pi.seen.filter((m) => m.type === "agent_end").length >= n;
		try {
			await pi.waitFor((m) => m.type === "extension_ui_request" && m.method === "setStatus" && /sandbox: \S+ bwrap/.test(String(m.statusText)));
			assert.equal((await pi.request({ id: "p1", type: "prompt", message: "/sandbox plan" })).success, true);
			await pi.waitFor(() => notes.some((n) => /operating mode plan/.test(n)));
			assert.ok(notes.some((n) => /Bash runs without asking and can still change the workspace/.test(n)), notes.join("\n"));
			assert.equal((await pi.request({ id: "p2", type: "prompt", message: "make a plan" })).success, true);
			await pi.waitFor(ended(1));
			const planned = toolsOf(model.requests.at(-1));
			assert.ok(planned.includes("read") && planned.includes("bash"), planned.join());
			assert.ok(!planned.includes("write") && !planned.includes("edit"), planned.join());
			assert.equal((await pi.request({ id: "p3", type: "prompt", message: "/sandbox agent" })).success, true);
			await pi.waitFor(() => notes.some((n) => /operating mode agent/.test(n)));
			assert.equal((await pi.request({ id: "p4", type: "prompt", message: "now do it" })).success, true);
			await pi.waitFor(ended(2));
			const agent = toolsOf(model.requests.at(-1));
			assert.ok(agent.includes("write") && agent.includes("edit"), agent.join());
		} finally {
			await pi.close();
			await model.close();
			rmSync(path.join(home, ".pi"), { recursive: true, force: true });
		}
	});

	it("a resumed pi session gets its sandbox modes back, and /sandbox mode inherit drops the session's own", async () => {
		const sessions = tempDir("pi-sbx-rpc-sessions-");
		// pi writes its session file once it holds a conversation: one scripted exchange makes it.
		const model = await FakeModel.start([{ text: "noted" }]);
		piHome(home, model);
		const modelFlags = ["--provider", FAKE_PROVIDER, "--model", FAKE_MODEL, "--session-dir", sessions];
		const status = (pattern: RegExp) => (m: Message) =>
			m.type === "extension_ui_request" && m.method === "setStatus" && pattern.test(String(m.statusText));
		const said = (pi: PiRpc, pattern: RegExp) => (m: Message) =>
			m.type === "extension_ui_request" && m.method === "notify" && pattern.test(String(m.message));
		try {
			const first = new PiRpc(workspace, env("ask"), modelFlags, { keepSession: true });
			try {
				await first.waitFor(status(/ ask$/));
				await first.request({ id: "m1", type: "prompt", message: "/sandbox mode auto" });
				await first.waitFor(said(first, /permission mode auto, operating mode agent/));
				await first.request({ id: "m2", type: "prompt", message: "/sandbox plan" });
				await first.waitFor(status(/ auto plan$/));
				await first.request({ id: "m2b", type: "prompt", message: "remember this" });
				await first.waitFor((m) => m.type === "agent_end");
			} finally {
				await first.close();
			}
			const resumed = new PiRpc(workspace, env("ask"), [...modelFlags, "--continue"], { keepSession: true });
			try {
				await resumed.waitFor(status(/ auto plan$/)); // the modes it chose, on a new sandbox session
				await resumed.request({ id: "m3", type: "prompt", message: "/sandbox mode inherit" });
				await resumed.waitFor(said(resumed, /permission mode ask, operating mode plan/)); // SANDBOX_MODE's again
			} finally {
				await resumed.close();
			}
		} finally {
			await model.close();
			rmSync(sessions, { recursive: true, force: true });
			rmSync(path.join(home, ".pi"), { recursive: true, force: true });
		}
	});

	it("the user's !command runs in the jail", async () => {
		const pi = new PiRpc(workspace, env("auto"));
		try {
			const response = await pi.request({ id: "b1", type: "bash", command: 'id -u; echo "$HOME"' });
			assert.equal(response.success, true, JSON.stringify(response));
			const data = response.data as { output: string; exitCode: number };
			const [uid, jailHome] = data.output.trim().split("\n");
			assert.notEqual(uid, "0");
			assert.notEqual(jailHome, home);
			assert.equal(data.exitCode, 0);
		} finally {
			await pi.close();
		}
	});

	it("an approval shows as pi's select dialog; Deny means the command never runs", async () => {
		const pi = new PiRpc(workspace, env("ask"));
		const dialogs: Message[] = [];
		pi.onUiRequest = (request) => {
			if (request.method !== "select") return undefined;
			dialogs.push(request);
			return { value: "Deny" };
		};
		try {
			const canary = path.join(workspace, "ran");
			const response = await pi.request({ id: "b2", type: "bash", command: `rm -rf /tmp/anything; touch ${canary}` });
			assert.equal(dialogs.length, 1, JSON.stringify(pi.seen).slice(-1500));
			assert.match(String(dialogs[0]?.title), /Sandbox: allow Bash to execute/);
			assert.deepEqual(dialogs[0]?.options, ["Allow once", "Allow for this session", "Deny"]);
			assert.notEqual((response.data as { exitCode?: number } | undefined)?.exitCode, 0, JSON.stringify(response));
			assert.equal(existsSync(canary), false);
		} finally {
			await pi.close();
		}
	});
});
