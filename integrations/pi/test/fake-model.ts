/**
 * A scripted model on loopback for driving pi's real agent loop: an OpenAI-compatible
 * `/v1/chat/completions` endpoint that streams, request by request, the replies it was given
 * (tool calls or text), and records every request body (what pi sent the model: the tool
 * results included). `piHome()` writes a HOME whose `~/.pi/agent/models.json` points pi at it.
 */
import { spawn } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

export type Reply = { toolCalls: Array<{ name: string; args: Record<string, unknown> }> } | { text: string };

export const FAKE_PROVIDER = "fake";
export const FAKE_MODEL = "scripted";

export class FakeModel {
	readonly requests: Array<Record<string, unknown>> = [];
	private readonly server: Server;
	private next = 0;

	private constructor(
		server: Server,
		private readonly replies: Reply[],
	) {
		this.server = server;
	}

	static async start(replies: Reply[]): Promise<FakeModel> {
		let model: FakeModel | undefined;
		const server = createServer((req, res) => {
			let body = "";
			req.on("data", (chunk: Buffer) => (body += chunk.toString()));
			req.on("end", () => model?.answer(body, res));
		});
		model = new FakeModel(server, replies);
		await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
		return model;
	}

	get baseUrl(): string {
		return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
	}

	/** The text of every tool result pi sent back to the model, in order. */
	toolResults(): string[] {
		const found: string[] = [];
		const last = this.requests.at(-1);
		for (const message of (last?.messages as Array<Record<string, unknown>> | undefined) ?? []) {
			if (message.role !== "tool") continue;
			const content = message.content;
			found.push(typeof content === "string" ? content : JSON.stringify(content));
		}
		return found;
	}

	private answer(body: string, res: import("node:http").ServerResponse): void {
		this.requests.push(JSON.parse(body || "{}") as Record<string, unknown>);
		const reply = this.replies[Math.min(this.next++, this.replies.length - 1)] ?? { text: "done" };
		res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
		const chunk = (delta: Record<string, unknown>, finish: string | null) =>
			res.write(`data: ${JSON.stringify({ id: `c${this.next}`, object: "chat.completion.chunk", created: 0, model: FAKE_MODEL, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`);
		if ("text" in reply) {
			chunk({ role: "assistant", content: reply.text }, null);
			chunk({}, "stop");
		} else {
			const toolCalls = reply.toolCalls.map((call, index) => ({
				index,
				id: `call_${this.next}_${index}`,
				type: "function",
				function: { name: call.name, arguments: JSON.stringify(call.args) },
			}));
			chunk({ role: "assistant", tool_calls: toolCalls }, null);
			chunk({}, "tool_calls");
		}
		res.end("data: [DONE]\n\n");
	}

	close(): Promise<void> {
		this.server.closeAllConnections();
		return new Promise((resolve) => this.server.close(() => resolve()));
	}
}

/** Make `home`'s pi configuration point at the fake model (no network, no credentials). */
export function piHome(home: string, model: FakeModel): void {
	const agent = path.join(home, ".pi", "agent");
	mkdirSync(agent, { recursive: true });
	const provider = {
		baseUrl: model.baseUrl,
		api: "openai-completions",
		apiKey: "scripted",
		compat: { supportsUsageInStreaming: false },
		models: [{ id: FAKE_MODEL }],
	};
	writeFileSync(path.join(agent, "models.json"), JSON.stringify({ providers: { [FAKE_PROVIDER]: provider } }));
}

const extensionDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
export const PI_CLI = path.join(extensionDir, "node_modules/@earendil-works/pi-coding-agent/dist/bundle/cli.js");

export interface PiRun {
	code: number | null;
	stdout: string;
	stderr: string;
}

/** `pi -p PROMPT` with this extension and the fake model, as a user runs it headless. */
export async function piPrint(cwd: string, env: NodeJS.ProcessEnv, prompt: string, flags: string[] = []): Promise<PiRun> {
	const argv = [PI_CLI, "-p", "--no-session", "--no-extensions", "-e", extensionDir, "--provider", FAKE_PROVIDER, "--model", FAKE_MODEL];
	const child = spawn(process.execPath, [...argv, ...flags, prompt], { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
	let stdout = "";
	let stderr = "";
	child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
	child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
	const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
	return { code, stdout, stderr };
}
