/**
 * A JSON-RPC 2.0 client for `sandbox serve` over the child's stdio, one JSON object per line.
 *
 * Fails closed: once the child exits, errs, breaks its pipe or sends a line that is not a
 * JSON-RPC message, every pending request is rejected with a SandboxError and every later
 * request is rejected at once. Nothing here ever runs anything but the server itself.
 */

import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { SandboxError, SandboxProtocolError, SandboxRpcError, SandboxTimeoutError, SandboxUnavailableError } from "./errors.ts";
import type { JsonRpcErrorObject, JsonRpcId } from "./protocol.ts";

export interface SandboxClientOptions {
	/** The `sandbox` executable. */
	bin: string;
	/** Arguments; default `["serve"]`. */
	args?: readonly string[];
	env?: NodeJS.ProcessEnv;
	cwd?: string;
	/** Longest protocol line accepted from the server (default 96 MiB). */
	maxLineBytes?: number;
	/** How much of the server's stderr (its log) to keep for error messages (default 8 KiB). */
	stderrTailBytes?: number;
	/** Sees the server's stderr as it arrives, e.g. to write a log file. */
	onStderr?: (text: string) => void;
}

export interface RequestOptions {
	/** Reject with SANDBOX_TIMEOUT (and send `$/cancelRequest`) when no answer arrives in time. */
	timeoutMs?: number;
	/** Reject with ABORTED (and send `$/cancelRequest`) when aborted. */
	signal?: AbortSignal;
}

export interface ExitInfo {
	code: number | null;
	signal: NodeJS.Signals | null;
}

type NotificationHandler = (params: unknown) => void;
type RequestHandler = (params: unknown) => Promise<unknown> | unknown;

interface Pending {
	method: string;
	resolve: (value: unknown) => void;
	reject: (error: Error) => void;
	cleanup: () => void;
}

const DEFAULT_MAX_LINE = 96 * 1024 * 1024;
const DEFAULT_STDERR_TAIL = 8 * 1024;
/** After `exit`, how long to wait for stdout to drain before failing what is still pending. */
const DRAIN_AFTER_EXIT_MS = 1000;

export class SandboxClient {
	readonly bin: string;
	private readonly child: ChildProcessWithoutNullStreams;
	private readonly pending = new Map<JsonRpcId, Pending>();
	private readonly notificationHandlers = new Map<string, Set<NotificationHandler>>();
	private readonly requestHandlers = new Map<string, RequestHandler>();
	private readonly maxLineBytes: number;
	private readonly stderrTailBytes: number;
	private readonly exitWaiters: Array<(info: ExitInfo) => void> = [];
	private chunks: Buffer[] = [];
	private bufferedBytes = 0;
	private nextId = 1;
	private stderrTail = "";
	private failure: SandboxError | undefined;
	private exitInfo: ExitInfo | undefined;

	private constructor(options: SandboxClientOptions) {
		this.bin = options.bin;
		this.maxLineBytes = options.maxLineBytes ?? DEFAULT_MAX_LINE;
		this.stderrTailBytes = options.stderrTailBytes ?? DEFAULT_STDERR_TAIL;
		this.child = spawn(options.bin, [...(options.args ?? ["serve"])], {
			cwd: options.cwd,
			env: options.env ?? process.env,
			stdio: ["pipe", "pipe", "pipe"],
		});
		this.child.stdout.on("data", (chunk: Buffer) => this.onStdout(chunk));
		this.child.stderr.setEncoding("utf8");
		this.child.stderr.on("data", (text: string) => {
			this.stderrTail = (this.stderrTail + text).slice(-this.stderrTailBytes);
			options.onStderr?.(text);
		});
		// A write to a dead child raises EPIPE here; the exit handler reports it.
		this.child.stdin.on("error", () => {});
		this.child.on("error", (error: NodeJS.ErrnoException) => {
			const why = error.code === "ENOENT" ? `${options.bin} was not found (set SANDBOX_BIN)` : error.message;
			this.fail(new SandboxUnavailableError(`could not run the sandbox server: ${why}`));
			this.recordExit({ code: null, signal: null });
		});
		this.child.on("exit", (code, signal) => {
			this.recordExit({ code, signal });
			// Let stdout drain first: a response may still be in the pipe.
			setTimeout(() => this.fail(this.exitError()), DRAIN_AFTER_EXIT_MS).unref();
		});
		this.child.on("close", () => this.fail(this.exitError()));
	}

	static spawn(options: SandboxClientOptions): SandboxClient {
		return new SandboxClient(options);
	}

	get pid(): number | undefined {
		return this.child.pid;
	}

	/** False once the server exited or the connection failed; every call then fails. */
	get alive(): boolean {
		return this.failure === undefined;
	}

	/** Why the connection is unusable, if it is. */
	get error(): SandboxError | undefined {
		return this.failure;
	}

	get stderr(): string {
		return this.stderrTail;
	}

	/** Resolves when the child process has exited (at once if it already has). */
	waitForExit(): Promise<ExitInfo> {
		if (this.exitInfo) return Promise.resolve(this.exitInfo);
		return new Promise((resolve) => this.exitWaiters.push(resolve));
	}

	request<T = unknown>(method: string, params: unknown, options: RequestOptions = {}): Promise<T> {
		if (this.failure) return Promise.reject(this.failure);
		if (this.exitInfo) return Promise.reject(this.exitError());
		const { signal, timeoutMs } = options;
		if (signal?.aborted) return Promise.reject(new SandboxError("ABORTED", `${method}: aborted`));
		const id = this.nextId++;
		return new Promise<T>((resolve, reject) => {
			let timer: NodeJS.Timeout | undefined;
			const onAbort = () => {
				this.settle(id)?.reject(new SandboxError("ABORTED", `${method}: aborted`));
				this.notify("$/cancelRequest", { id });
			};
			const cleanup = () => {
				if (timer) clearTimeout(timer);
				signal?.removeEventListener("abort", onAbort);
			};
			this.pending.set(id, { method, resolve: resolve as (value: unknown) => void, reject, cleanup });
			if (timeoutMs !== undefined) {
				timer = setTimeout(() => {
					this.settle(id)?.reject(
						new SandboxTimeoutError(`the sandbox server did not answer ${method} within ${Math.round(timeoutMs / 1000)} s`),
					);
					this.notify("$/cancelRequest", { id });
				}, timeoutMs);
			}
			signal?.addEventListener("abort", onAbort, { once: true });
			this.send({ jsonrpc: "2.0", id, method, params });
		});
	}

	notify(method: string, params: unknown): void {
		if (this.failure) return;
		this.send({ jsonrpc: "2.0", method, params });
	}

	/** Subscribe to a server notification; returns the unsubscribe function. */
	onNotification(method: string, handler: NotificationHandler): () => void {
		let handlers = this.notificationHandlers.get(method);
		if (!handlers) {
			handlers = new Set();
			this.notificationHandlers.set(method, handlers);
		}
		handlers.add(handler);
		return () => handlers.delete(handler);
	}

	/**
	 * Answer server-to-client requests of `method`. A request without a handler, or whose
	 * handler throws, gets a JSON-RPC error (for `approval.request` the server reads that as deny).
	 */
	handleRequests(method: string, handler: RequestHandler): void {
		this.requestHandlers.set(method, handler);
	}

	/** Polite stop: `shutdown`, close stdin, wait; SIGKILL after `graceMs`. */
	async shutdown(graceMs = 3000): Promise<ExitInfo> {
		if (this.alive) {
			await this.request("shutdown", {}, { timeoutMs: graceMs }).catch(() => undefined);
		}
		this.child.stdin.end();
		const exited = this.waitForExit();
		const timer = setTimeout(() => this.kill("SIGKILL"), graceMs);
		timer.unref();
		try {
			return await exited;
		} finally {
			clearTimeout(timer);
		}
	}

	kill(signal: NodeJS.Signals = "SIGKILL"): void {
		if (this.exitInfo === undefined) this.child.kill(signal);
	}

	// -- plumbing ---------------------------------------------------------------------------

	private send(message: Record<string, unknown>): void {
		if (!this.child.stdin.writable) {
			this.fail(this.exitError());
			return;
		}
		this.child.stdin.write(`${JSON.stringify(message)}\n`);
	}

	private settle(id: JsonRpcId): Pending | undefined {
		const entry = this.pending.get(id);
		if (!entry) return undefined;
		this.pending.delete(id);
		entry.cleanup();
		return entry;
	}

	private onStdout(chunk: Buffer): void {
		let start = 0;
		let newline = chunk.indexOf(0x0a, start);
		while (newline !== -1) {
			this.chunks.push(chunk.subarray(start, newline));
			const line = Buffer.concat(this.chunks).toString("utf8");
			this.chunks = [];
			this.bufferedBytes = 0;
			if (line.trim()) this.onLine(line);
			if (this.failure) return;
			start = newline + 1;
			newline = chunk.indexOf(0x0a, start);
		}
		if (start < chunk.length) {
			this.chunks.push(chunk.subarray(start));
			this.bufferedBytes += chunk.length - start;
			if (this.bufferedBytes > this.maxLineBytes) {
				this.fatal(`the sandbox server sent a line longer than ${this.maxLineBytes} bytes`);
			}
		}
	}

	private onLine(line: string): void {
		let message: unknown;
		try {
			message = JSON.parse(line);
		} catch {
			this.fatal(`the sandbox server wrote a non-JSON line on stdout: ${line.slice(0, 200)}`);
			return;
		}
		if (typeof message !== "object" || message === null || Array.isArray(message)) {
			this.fatal("the sandbox server sent a message that is not a JSON object");
			return;
		}
		const msg = message as Record<string, unknown>;
		const hasId = typeof msg.id === "number" || typeof msg.id === "string";
		if (typeof msg.method === "string") {
			if (hasId) void this.onServerRequest(msg.id as JsonRpcId, msg.method, msg.params);
			else this.onNotificationMessage(msg.method, msg.params);
			return;
		}
		if (!hasId) return; // a response to nothing we can match (id null): the server logs it
		const entry = this.settle(msg.id as JsonRpcId);
		if (!entry) return; // late answer to a request that timed out or was aborted
		if (msg.error !== undefined) {
			const err = msg.error as Partial<JsonRpcErrorObject>;
			entry.reject(
				new SandboxRpcError(
					typeof err.code === "number" ? err.code : -32603,
					`sandbox ${entry.method}: ${typeof err.message === "string" ? err.message : "error"}`,
					err.data,
				),
			);
		} else {
			entry.resolve(msg.result);
		}
	}

	private onNotificationMessage(method: string, params: unknown): void {
		for (const handler of this.notificationHandlers.get(method) ?? []) {
			try {
				handler(params);
			} catch {
				// A subscriber's bug must not break the connection.
			}
		}
	}

	private async onServerRequest(id: JsonRpcId, method: string, params: unknown): Promise<void> {
		const handler = this.requestHandlers.get(method);
		if (!handler) {
			this.send({ jsonrpc: "2.0", id, error: { code: -32601, message: `the client does not handle ${method}` } });
			return;
		}
		try {
			const result = await handler(params);
			this.send({ jsonrpc: "2.0", id, result: result ?? null });
		} catch (error) {
			const message = error instanceof Error ? error.message : String(error);
			this.send({ jsonrpc: "2.0", id, error: { code: -32000, message } });
		}
	}

	private exitError(): SandboxUnavailableError {
		const info = this.exitInfo;
		const how = !info ? "closed its pipes" : info.signal ? `was killed by ${info.signal}` : `exited with code ${info.code}`;
		const log = this.stderrTail.trim();
		return new SandboxUnavailableError(
			`the sandbox server ${how}; nothing runs until it is restarted${log ? `\n--- server log (tail) ---\n${log.slice(-2000)}` : ""}`,
		);
	}

	private recordExit(info: ExitInfo): void {
		if (this.exitInfo) return;
		this.exitInfo = info;
		for (const waiter of this.exitWaiters.splice(0)) waiter(info);
	}

	/** A corrupt stream cannot be trusted to match answers to calls: fail and stop the server. */
	private fatal(message: string): void {
		this.fail(new SandboxProtocolError(message));
		this.kill("SIGKILL");
	}

	private fail(error: SandboxError): void {
		if (this.failure) return;
		this.failure = error;
		for (const id of [...this.pending.keys()]) this.settle(id)?.reject(error);
	}
}
