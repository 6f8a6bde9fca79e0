/**
 * One `sandbox serve` process with one session: the workspace it was opened with, the tool
 * calls made in it, the output they stream and the approvals they ask for.
 */

import type { Classify, ClassifyRequest } from "./classify.ts";
import { randomUUID } from "node:crypto";
import { SandboxClient, type SandboxClientOptions } from "./client.ts";
import { SandboxError, SandboxProtocolError } from "./errors.ts";
import {
	APPROVAL_DECISIONS,
	type ApplyReport,
	type ApprovalDecision,
	type ApprovalRequest,
	type Backend,
	type ChangesetSummary,
	type ChangesetView,
	type InitializeResult,
	type MountStrategy,
	type NetworkDenial,
	type NetworkMode,
	type OperatingMode,
	type OutputStream,
	PROTOCOL_VERSION,
	type PermissionMode,
	type PluginInfo,
	type PluginToolInfo,
	parseApprovalRequest,
	parseNetworkDenial,
	parseToolOutput,
	parseToolResult,
	type PendingChanges,
	type RollbackResult,
	type SessionCloseResult,
	type SessionOpenParams,
	type SessionConfigureResult,
	type SessionForkResult,
	type SessionOpenResult,
	type SessionRestoreResult,
	type SessionSnapshot,
	type ToolResult,
} from "./protocol.ts";

/**
 * Decides an `approval.request`. `signal` aborts when the answer is no longer wanted (the call
 * ended, e.g. because the server's approval timeout denied it, or the user aborted the call).
 * Throwing, or answering anything but a decision, counts as deny.
 */
export type Approver = (request: ApprovalRequest, signal: AbortSignal) => Promise<ApprovalVerdict> | ApprovalVerdict;

/** An approver's answer: a decision, or `NO_ONE` when there is nobody to ask (no UI): the server
 * then refuses the call as no one's decision, not as a user's denial. */
export type ApprovalVerdict = ApprovalDecision | typeof NO_ONE;
export const NO_ONE = "no-one" as const;

/** Used when the caller gives no approver: there is no one to ask. */
export const denyAll: Approver = () => NO_ONE;

export interface SandboxSessionOptions {
	workspace: string;
	/** The `sandbox` executable; default `$SANDBOX_BIN`, else `sandbox` on PATH. */
	bin?: string;
	/** Arguments of the server (default `["serve"]`). */
	args?: readonly string[];
	profile?: string;
	backend?: Backend;
	mode?: PermissionMode;
	mount?: MountStrategy;
	network?: NetworkMode;
	allowHosts?: string[];
	/** Package indexes by name or `NAME=URL` (implies the allowlist network). */
	allowIndexes?: string[];
	/** Plugin manifests to declare (each registered only after `registerPlugin`'s grant). */
	plugins?: string[];
	/** Told of each connection the allowlist refused, as it happens. */
	onDenial?: (denial: NetworkDenial) => void;
	/** Environment of the server process (default: this process's). */
	env?: NodeJS.ProcessEnv;
	/** Used for approvals of calls that bring no approver of their own. Default: deny. */
	approver?: Approver;
	/**
	 * Answers the question `session.open` puts when the profile says `default_project_trust = "ask"`
	 * and the workspace has an undecided policy file (`rule_id` `trust.ask`). Default: no one, so the
	 * project stays untrusted. A yes trusts it for this session only.
	 */
	trustApprover?: Approver;
	/** Deadline for starting the server and opening the session (default 60 s). */
	startupTimeoutMs?: number;
	clientName?: string;
	/** Answers the server's `classify.request` (seed 004's classifier) with pi's model; none: an error answer (asked). */
	classify?: Classify;
	onStderr?: SandboxClientOptions["onStderr"];
}

export interface CallOptions {
	signal?: AbortSignal;
	onOutput?: (stream: OutputStream, data: string) => void;
	/** Answers this call's approval requests (default: the session's approver). */
	approver?: Approver;
	/** Prefix of the server-side tool_call_id, e.g. pi's tool call id, to correlate audit records. */
	idPrefix?: string;
	turnId?: string;
	/** The user's latest message, handed to the sandbox's classifier ("yes, publish it" authorises a retry). */
	userMessage?: string;
	/** Client-side deadline for the whole call, approval included (default 8 min). */
	timeoutMs?: number;
}

interface Route {
	onOutput?: CallOptions["onOutput"];
	approver: Approver;
	done: AbortController;
}

const DEFAULT_STARTUP_TIMEOUT_MS = 60_000;
const DEFAULT_CALL_TIMEOUT_MS = 8 * 60_000;
/** After `tool.cancel`, how long the server may take to confirm that the call's processes are dead. */
const CANCEL_CONFIRM_MS = 15_000;
/** `session.close` of a copy/overlay session keeps its changes first: a large tree takes a while. */
const END_TIMEOUT_MS = 120_000;
/** Reading, applying or discarding a kept changeset (an apply of thousands of files included). */
const CHANGES_TIMEOUT_MS = 10 * 60_000;

export function defaultSandboxBin(env: NodeJS.ProcessEnv = process.env): string {
	return env.SANDBOX_BIN?.trim() || "sandbox";
}

export class SandboxSession {
	readonly client: SandboxClient;
	readonly server: InitializeResult;
	/** What the session said when it opened; its modes follow `configure`. */
	info: SessionOpenResult;
	private readonly routes = new Map<string, Route>();
	/** The running `session.restore`'s route: the server asks under an id of its own (`restore-…`). */
	private restoring: Route | undefined;
	private readonly defaultApprover: Approver;
	private counter = 0;
	private ending: Promise<SessionCloseResult | undefined> | undefined;
	private closing: Promise<void> | undefined;

	private constructor(client: SandboxClient, server: InitializeResult, info: SessionOpenResult, approver: Approver) {
		this.client = client;
		this.server = server;
		this.info = info;
		this.defaultApprover = approver;
		client.onNotification("tool.output", (params) => {
			const output = parseToolOutput(params);
			if (output) this.routes.get(output.tool_call_id)?.onOutput?.(output.stream, output.data);
		});
		client.handleRequests("approval.request", (params) => this.onApproval(params));
	}

	/** Start the server, check its protocol, open the session. Fails (and stops the server) on any problem. */
	static async open(options: SandboxSessionOptions): Promise<SandboxSession> {
		const client = SandboxClient.spawn({
			bin: options.bin ?? defaultSandboxBin(options.env),
			args: options.args,
			env: options.env,
			onStderr: options.onStderr,
		});
		const timeoutMs = options.startupTimeoutMs ?? DEFAULT_STARTUP_TIMEOUT_MS;
		try {
			const server = await client.request<InitializeResult>("initialize", { client: options.clientName ?? "pi-sandbox" }, { timeoutMs });
			if (server?.protocol !== PROTOCOL_VERSION) {
				throw new SandboxProtocolError(`the sandbox server speaks protocol ${String(server?.protocol)}, this extension ${PROTOCOL_VERSION}`);
			}
			const params: SessionOpenParams = { workspace: options.workspace };
			if (options.profile) params.profile = options.profile;
			if (options.backend) params.backend = options.backend;
			if (options.mode) params.mode = options.mode;
			if (options.mount) params.mount = options.mount;
			if (options.network) params.network = options.network;
			if (options.allowHosts?.length) params.allow_hosts = options.allowHosts;
			if (options.allowIndexes?.length) params.allow_indexes = options.allowIndexes;
			if (options.plugins?.length) params.plugins = options.plugins;
			// Before the session exists, the only question is whether to trust the project (seed 000 §10).
			client.handleRequests("approval.request", (request) => answerTrust(request, options.trustApprover));
			const info = await client.request<SessionOpenResult>("session.open", params, { timeoutMs });
			if (typeof info?.session_id !== "string") throw new SandboxProtocolError("session.open returned no session_id");
			const session = new SandboxSession(client, server, info, options.approver ?? denyAll);
			const classify = options.classify;
			if (classify) client.handleRequests("classify.request", (request) => classify(request as ClassifyRequest));
			const onDenial = options.onDenial;
			if (onDenial) {
				client.onNotification("network.denied", (params) => {
					const denial = parseNetworkDenial(params);
					if (denial) onDenial(denial);
				});
			}
			return session;
		} catch (error) {
			client.kill("SIGKILL");
			throw error;
		}
	}

	/** The session takes calls: its server runs and it was neither ended nor closed. */
	get alive(): boolean {
		return this.client.alive && this.ending === undefined;
	}

	get pid(): number | undefined {
		return this.client.pid;
	}

	/**
	 * Run one tool in the sandbox. Resolves with the server's ToolResult (a refusal or a failed
	 * tool is a result with `ok: false`); rejects with a SandboxError when there is no answer:
	 * the server is gone, timed out, or the call was aborted.
	 */
	async call(tool: string, args: Record<string, unknown>, options: CallOptions = {}): Promise<ToolResult> {
		const { signal } = options;
		if (!this.alive) throw this.client.error ?? new SandboxError("SANDBOX_UNAVAILABLE", "the sandbox session is closed");
		if (signal?.aborted) throw new SandboxError("ABORTED", `${tool}: aborted before it started`);
		const id = `${options.idPrefix ?? "pi"}:${++this.counter}:${randomUUID().slice(0, 8)}`;
		const route: Route = { onOutput: options.onOutput, approver: options.approver ?? this.defaultApprover, done: new AbortController() };
		this.routes.set(id, route);
		const params = {
			session_id: this.info.session_id,
			tool,
			args,
			tool_call_id: id,
			...(options.turnId ? { turn_id: options.turnId } : {}),
			...(options.userMessage ? { user_message: options.userMessage } : {}),
		};
		const answer = this.client.request("tool.call", params, { timeoutMs: options.timeoutMs ?? DEFAULT_CALL_TIMEOUT_MS });
		let onAbort: (() => void) | undefined;
		const aborted = new Promise<never>((_, reject) => {
			onAbort = () => {
				// The server answers the pending call with ABORTED once the call's processes are dead.
				void this.client.request("tool.cancel", { tool_call_id: id }, { timeoutMs: CANCEL_CONFIRM_MS }).catch(() => undefined);
				setTimeout(
					() => reject(new SandboxError("ABORTED", `${tool}: aborted, but the sandbox server did not confirm the cancel`)),
					CANCEL_CONFIRM_MS,
				).unref();
			};
			signal?.addEventListener("abort", onAbort, { once: true });
		});
		aborted.catch(() => undefined);
		try {
			const raw = await Promise.race([answer, aborted]);
			const result = parseToolResult(raw);
			if (!result) throw new SandboxProtocolError(`tool.call ${tool}: the server's answer is not a ToolResult`);
			return result;
		} finally {
			if (onAbort) signal?.removeEventListener("abort", onAbort);
			this.routes.delete(id);
			route.done.abort();
		}
	}

	/**
	 * End the session and keep the server, e.g. to review the changeset it kept: a copy/overlay
	 * session's changes are kept by the server (`changeset_id`), never discarded. Idempotent;
	 * resolves to undefined when the server could not answer.
	 */
	end(timeoutMs = END_TIMEOUT_MS): Promise<SessionCloseResult | undefined> {
		this.ending ??= this.client.alive
			? this.client.request<SessionCloseResult>("session.close", { session_id: this.info.session_id }, { timeoutMs }).catch(() => undefined)
			: Promise.resolve(undefined);
		return this.ending;
	}

	/** End the session (keeping its changes) and stop the server; idempotent. */
	close(graceMs = 3000): Promise<void> {
		this.closing ??= (async () => {
			await this.end();
			await this.client.shutdown(graceMs);
		})();
		return this.closing;
	}

	/** What this live copy/overlay session has changed so far (nothing is kept yet). */
	pending(): Promise<PendingChanges> {
		return this.client.request<PendingChanges>("session.changes", { session_id: this.info.session_id }, { timeoutMs: CHANGES_TIMEOUT_MS });
	}

	/** The kept changesets of this session's workspace (of every session and run), oldest first. */
	async listChanges(): Promise<ChangesetSummary[]> {
		const answer = await this.client.request<{ changesets: ChangesetSummary[] }>(
			"changes.list",
			{ workspace: this.info.workspace },
			{ timeoutMs: CHANGES_TIMEOUT_MS },
		);
		return answer.changesets;
	}

	showChanges(id: string): Promise<ChangesetView> {
		return this.client.request<ChangesetView>("changes.show", { changeset_id: id }, { timeoutMs: CHANGES_TIMEOUT_MS });
	}

	/** Apply a kept changeset: flagged entries only when named in `paths` or with `includeFlagged`. */
	applyChanges(id: string, options: { paths?: string[]; includeFlagged?: boolean } = {}): Promise<ApplyReport> {
		const params = { changeset_id: id, include_flagged: options.includeFlagged ?? false, ...(options.paths ? { paths: options.paths } : {}) };
		return this.client.request<ApplyReport>("changes.apply", params, { timeoutMs: CHANGES_TIMEOUT_MS });
	}

	/** Change the session's permission mode or operating mode between calls (CONFLICT with a call in flight). */
	async configure(change: {
		mode?: PermissionMode | "inherit";
		operating_mode?: OperatingMode;
		network?: { allow?: string[]; deny?: string[]; ask?: boolean };
	}): Promise<SessionConfigureResult> {
		const now: SessionConfigureResult = await this.client.request(
			"session.configure",
			{ session_id: this.info.session_id, ...change },
			{ timeoutMs: CHANGES_TIMEOUT_MS },
		);
		this.info = { ...this.info, mode: now.mode, operating_mode: now.operating_mode };
		return now;
	}

	async discardChanges(id: string): Promise<void> {
		await this.client.request("changes.discard", { changeset_id: id }, { timeoutMs: CHANGES_TIMEOUT_MS });
	}

	/**
	 * Put back the file a Write or Edit of this session changed (its review record's
	 * `snapshot_id`), as it was before the tool ran. Rejects with a SandboxRpcError: CONFLICT when
	 * the file changed since (it is left alone) or cannot be restored, INVALID_ARGUMENT when this
	 * session has no such snapshot. A snapshot already rolled back answers `ok` again.
	 */
	rollback(snapshotId: string, timeoutMs = 60_000): Promise<RollbackResult> {
		return this.client.request<RollbackResult>("snapshot.rollback", { session_id: this.info.session_id, snapshot_id: snapshotId }, { timeoutMs });
	}

	/**
	 * Keep the session's file state (its view of the workspace, its scratch directory and its
	 * modes; no process) under a new id. Rejects with a SandboxRpcError: INVALID_ARGUMENT for an
	 * `rw` session (the real workspace cannot be rolled back behind the user), CONFLICT with a call
	 * in flight or past the snapshot caps.
	 */
	snapshot(): Promise<SessionSnapshot> {
		return this.client.request<SessionSnapshot>("session.snapshot", { session_id: this.info.session_id }, { timeoutMs: CHANGES_TIMEOUT_MS });
	}

	/**
	 * Bring the session back to a snapshot of its own line, in a new jail (no process carried over);
	 * its scratch directory and modes come back with it (`info` follows). In `ask` the server asks
	 * first (an `approval.request` of tool `session.restore`, under an id of its own), answered by
	 * `approver`. Rejects with a SandboxRpcError: CONFLICT when the host changed a path of the
	 * snapshot since (the error's `data.data.paths`; `force` restores all the same and leaves it to
	 * the apply) or a call is in flight, INVALID_ARGUMENT for a snapshot of another workspace or
	 * line, TOOL_DENIED when declined (or in plan and goal).
	 */
	async restore(snapshotId: string, options: { force?: boolean; approver?: Approver; turnId?: string } = {}): Promise<SessionRestoreResult> {
		if (!this.alive) throw this.client.error ?? new SandboxError("SANDBOX_UNAVAILABLE", "the sandbox session is closed");
		if (this.restoring) throw new SandboxError("CONFLICT", "a restore of this session is already running");
		const route: Route = { approver: options.approver ?? this.defaultApprover, done: new AbortController() };
		this.restoring = route;
		try {
			const params = {
				session_id: this.info.session_id,
				snapshot_id: snapshotId,
				force: options.force ?? false,
				...(options.turnId ? { turn_id: options.turnId } : {}),
			};
			const restored = await this.client.request<SessionRestoreResult>("session.restore", params, { timeoutMs: DEFAULT_CALL_TIMEOUT_MS });
			await this.configure({}).catch(() => undefined); // the snapshot's modes are the session's now
			return restored;
		} finally {
			this.restoring = undefined;
			route.done.abort();
		}
	}

	/**
	 * `n` (1 to 16) new sessions from this one's state now (a snapshot taken for them), each with
	 * its own jail and changeset, served by this server under its own id; this session goes on.
	 */
	fork(n: number, options: { turnId?: string } = {}): Promise<SessionForkResult> {
		const params = { session_id: this.info.session_id, n, ...(options.turnId ? { turn_id: options.turnId } : {}) };
		return this.client.request<SessionForkResult>("session.fork", params, { timeoutMs: CHANGES_TIMEOUT_MS });
	}

	/**
	 * Register a declared plugin's tools: the server asks the user (an approval request whose
	 * operation is `register`, answered by `approver`); refused, `registered` is false with the reason.
	 */
	registerPlugin(pluginId: string, options: { approver?: Approver; turnId?: string } = {}): Promise<PluginInfo> {
		return this.routed("register", options.approver, (id) =>
			this.client.request<PluginInfo>(
				"plugin.register",
				{ session_id: this.info.session_id, plugin_id: pluginId, tool_call_id: id, ...(options.turnId ? { turn_id: options.turnId } : {}) },
				{ timeoutMs: DEFAULT_CALL_TIMEOUT_MS },
			),
		);
	}

	/**
	 * Put a tool this client runs itself (another extension's) to the sandbox's gate: the policy,
	 * the user's approval and the audit; `ok` says it may run. Nothing runs in the sandbox.
	 */
	async checkTool(tool: string, args: Record<string, unknown>, options: { approver?: Approver; turnId?: string; idPrefix?: string } = {}): Promise<ToolResult> {
		const raw = await this.routed(options.idPrefix ?? "check", options.approver, (id) =>
			this.client.request(
				"tool.check",
				{ session_id: this.info.session_id, tool, args, tool_call_id: id, ...(options.turnId ? { turn_id: options.turnId } : {}) },
				{ timeoutMs: DEFAULT_CALL_TIMEOUT_MS },
			),
		);
		const result = parseToolResult(raw);
		if (!result) throw new SandboxProtocolError(`tool.check ${tool}: the server's answer is not a ToolResult`);
		return result;
	}

	/** The tools the session's model may call now (built-ins and registered plugin tools). */
	async listTools(): Promise<PluginToolInfo[]> {
		const answer = await this.client.request<{ tools: PluginToolInfo[] }>("tools.list", { session_id: this.info.session_id }, { timeoutMs: CHANGES_TIMEOUT_MS });
		return answer.tools;
	}

	/** A request whose approval requests are routed to `approver` under a fresh id. */
	private async routed<T>(prefix: string, approver: Approver | undefined, send: (id: string) => Promise<T>): Promise<T> {
		if (!this.alive) throw this.client.error ?? new SandboxError("SANDBOX_UNAVAILABLE", "the sandbox session is closed");
		const id = `${prefix}:${++this.counter}:${randomUUID().slice(0, 8)}`;
		const route: Route = { approver: approver ?? this.defaultApprover, done: new AbortController() };
		this.routes.set(id, route);
		try {
			return await send(id);
		} finally {
			this.routes.delete(id);
			route.done.abort();
		}
	}

	private async onApproval(params: unknown): Promise<{ decision: ApprovalDecision; answered_by?: "nobody" }> {
		const request = parseApprovalRequest(params);
		if (!request || request.session_id !== this.info.session_id) return { decision: "deny" };
		const route = this.routes.get(request.tool_call_id) ?? (request.tool === "session.restore" ? this.restoring : undefined);
		// A request for a call we do not know about (finished, or never ours): deny.
		if (!route) return { decision: "deny" };
		try {
			const decision = await route.approver(request, route.done.signal);
			if (decision === NO_ONE) return { decision: "deny", answered_by: "nobody" };
			if (!APPROVAL_DECISIONS.includes(decision)) return { decision: "deny" };
			if (route.done.signal.aborted) return { decision: "deny" };
			if (decision === "allow-session" && request.allow_session === false) return { decision: "allow-once" };
			return { decision };
		} catch {
			return { decision: "deny" };
		}
	}
}

/** The project-trust question of `session.open`: only `trust.ask` is answered, by `approver` (none: no one). */
async function answerTrust(params: unknown, approver: Approver | undefined): Promise<{ decision: ApprovalDecision; answered_by?: "nobody" }> {
	const request = parseApprovalRequest(params);
	if (!request || request.rule_id !== "trust.ask") return { decision: "deny" };
	if (!approver) return { decision: "deny", answered_by: "nobody" };
	const done = new AbortController();
	try {
		const decision = await approver(request, done.signal);
		if (decision === NO_ONE) return { decision: "deny", answered_by: "nobody" };
		return APPROVAL_DECISIONS.includes(decision) ? { decision } : { decision: "deny" };
	} catch {
		return { decision: "deny" };
	} finally {
		done.abort();
	}
}
