/**
 * Wire types of `sandbox serve` (JSON-RPC 2.0, one JSON object per line; see ../PROTOCOL.md).
 * Only what the pi extension reads is typed; everything else stays `unknown` and is checked
 * where it is used.
 */

export const PROTOCOL_VERSION = 1;

export type JsonRpcId = number | string;

export interface JsonRpcErrorObject {
	code: number;
	message: string;
	data?: unknown;
}

export interface JsonRpcRequest {
	jsonrpc: "2.0";
	id: JsonRpcId;
	method: string;
	params?: unknown;
}

export interface JsonRpcNotification {
	jsonrpc: "2.0";
	method: string;
	params?: unknown;
}

export interface JsonRpcResponse {
	jsonrpc: "2.0";
	id: JsonRpcId | null;
	result?: unknown;
	error?: JsonRpcErrorObject;
}

export interface InitializeResult {
	server: string;
	version: string;
	protocol: number;
	tools: string[];
}

export type PermissionMode = "ask" | "accept-edits" | "auto";
/** Seed 003 §10: plan and goal are the contract modes (no Write, Edit nor plugin tool); entered from agent only. */
export type OperatingMode = "agent" | "plan" | "goal";
export type Backend = "auto" | "bwrap" | "docker" | "landlock" | "microvm" | "host" | "winjob";
export type MountStrategy = "ro" | "rw" | "copy" | "overlay";

export interface SessionOpenParams {
	workspace: string;
	profile?: string;
	backend?: Backend;
	mode?: PermissionMode;
	operating_mode?: OperatingMode;
	mount?: MountStrategy;
	network?: NetworkMode;
	/** Allowlist patterns added to the profile's (implies `network: "allowlist"`). */
	allow_hosts?: string[];
	/** Package indexes (`pypi`, `npm`, `crates`, `go`, or `NAME=URL` for a mirror): their hosts join the allowlist. */
	allow_indexes?: string[];
	/** Plugin manifests declared for the session; each needs `plugin.register`'s grant. */
	plugins?: string[];
	/** A session snapshot of this workspace to start from (`session.snapshot`'s `id`). */
	from_snapshot?: string;
}

/** A plugin tool as `plugin.register`, `plugin.list` and `tools.list` describe it. */
export interface PluginToolInfo {
	name: string;
	internal_name?: string;
	plugin?: string;
	description: string;
	parameters: Record<string, unknown>;
	risk?: "low" | "medium" | "high";
}

/** A declared plugin; `plugin.register` adds `reason` and `decided_by`. */
export interface PluginInfo {
	id: string;
	name: string;
	description: string;
	manifest: string;
	registered: boolean;
	visible?: boolean;
	warnings: string[];
	tools: PluginToolInfo[];
	reason?: string;
	decided_by?: string;
}

export type NetworkMode = "none" | "allowlist" | "host";

/** `network.denied`: a connection the allowlist proxy refused, as it happens. */
export interface NetworkDenial {
	session_id: string;
	tool_call_id: string;
	host: string;
	port: number;
	reason: string;
	rule: string | null;
	message: string;
	line: string;
}

export function parseNetworkDenial(value: unknown): NetworkDenial | undefined {
	if (!isRecord(value) || typeof value.host !== "string" || typeof value.port !== "number" || typeof value.line !== "string") return undefined;
	return value as unknown as NetworkDenial;
}

export interface SessionOpenResult {
	session_id: string;
	workspace: string;
	scratch_dir: string;
	backend: string;
	mount: string;
	profile: string;
	mode: string;
	operating_mode?: OperatingMode;
	/** What the session says once when it opens, e.g. `policy.project-ignored` (the project's policy file was ignored: not trusted). */
	notices?: SessionNotice[];
	/** The plugins declared for the session (`registered`: their tools may be called). */
	plugins?: PluginInfo[];
	/** The snapshot the session was opened from (a fork's, or `from_snapshot`), else null. */
	snapshot_id?: string | null;
}

export interface SessionNotice {
	code: string;
	message: string;
	file?: string;
}

/** What `session.configure` answers: the modes now in force, what they mean that a user may not
 * expect (`mode.bash-may-write`: plan or goal under auto still runs Bash unasked), and the tools
 * the model may call now (plan and goal list no Write, Edit or plugin tool). */
export interface SessionConfigureResult {
	session_id: string;
	mode: string;
	operating_mode: OperatingMode;
	notices?: SessionNotice[];
	tools?: string[];
	/** The session's network now: an allowlist session's may change live (`network.allow`). */
	network?: { mode: string; allow: string[]; deny: string[] };
}

/**
 * `session.snapshot`: the session's file state (its view of the workspace, its scratch directory
 * and its modes; no process) kept under `id`. `changed` and `deleted` count the paths where the
 * view differs from the workspace; `kind` is `layers` (overlay layers) or `scan` (a copy's changeset).
 */
export interface SessionSnapshot {
	session_id: string;
	id: string;
	kind: string;
	changed: number;
	deleted: number;
	bytes: number;
	parent?: string | null;
	took_ms?: number;
}

/** `session.restore`: the view back at `snapshot_id` in a new jail; `host_changed`, with `force`, the paths the host changed since. */
export interface SessionRestoreResult {
	session_id: string;
	snapshot_id: string;
	changed: number;
	host_changed: string[];
	took_ms: number;
}

/** `session.fork`: `sessions`, each a new session opened from `snapshot_id` (taken of this one now) and served under its own id. */
export interface SessionForkResult {
	session_id: string;
	snapshot_id: string;
	sessions: SessionOpenResult[];
}

/** What `session.close` answers; a copy/overlay session's changes are kept under `changeset_id`. */
export interface SessionCloseResult {
	closed: boolean;
	changeset_id?: string | null;
	counts?: ChangeCounts | null;
}

export interface ChangeCounts {
	added: number;
	modified: number;
	deleted: number;
	flagged: number;
	applied?: number;
}

/** One changed path of a changeset (the server's `Change`, plus `applied` once kept). */
export interface ChangeEntry {
	path: string;
	status: "added" | "modified" | "deleted";
	kind: string;
	flags?: string[];
	applicable?: boolean;
	reason?: string;
	applied?: boolean;
}

/** `session.changes`: what a live copy/overlay session has changed so far. */
export interface PendingChanges {
	session_id: string;
	mount: string;
	counts: ChangeCounts;
	changes: ChangeEntry[];
	untracked: string[];
}

/** A kept changeset as `changes.list` lists it. */
export interface ChangesetSummary {
	id: string;
	workspace: string;
	created: string;
	source: "run" | "session";
	profile: string;
	backend: string;
	state: "kept" | "partial" | "applied";
	counts: ChangeCounts;
	untracked: string[];
}

/** `changes.show`: the summary, its entries, the git summary lines and a unified diff against the host now. */
export interface ChangesetView extends ChangesetSummary {
	changes: ChangeEntry[];
	git_lines: string[];
	diff: string;
}

export interface HeldBack {
	path: string;
	flags: string[];
	group?: string;
	entries?: number;
	risky?: string[];
}

/** `changes.apply`: what was applied, and what was not with why. */
export interface ApplyReport {
	id: string;
	state: ChangesetSummary["state"];
	applied: string[];
	conflicts: Array<{ path: string; reason: string }>;
	skipped: Array<{ path: string; reason: string }>;
	held_back: HeldBack[];
}

export type ToolErrorCode =
	| "INVALID_ARGUMENT"
	| "TOOL_DENIED"
	| "TOOL_FAILED"
	| "TIMEOUT"
	| "ABORTED"
	| "SHELL_NOT_FOUND"
	| "BACKEND_UNAVAILABLE"
	| "GUARANTEE_UNAVAILABLE"
	| "CONFLICT"
	| "PLUGIN_DISABLED_IN_PLAN"
	| "COMMAND_SHELL_CHANGED"
	| "COMMAND_SHELL_INVALID";

export interface ToolResult {
	ok: boolean;
	content: string;
	error_code: ToolErrorCode | string | null;
	details: Record<string, unknown>;
	root?: "workspace" | "scratch" | "external" | null;
	review?: Record<string, unknown> | null;
}

/** What a reviewed tool did to the file; `delete` is modelled, though no tool deletes yet. */
export type ReviewOperation = "write" | "edit" | "delete";
export type ReviewStatus = "added" | "modified" | "deleted";
export type ReviewState = "active" | "rolledBack";

/**
 * `ToolResult.review`: the review record of a workspace Write or Edit (seed 003 §4c's
 * `ReviewChange`, in snake_case). `message_id` is the tool message that owns it, i.e. the call's
 * `tool_call_id`; the counts are null when the previous content was binary or too large to diff.
 */
export interface ReviewChange {
	version: number;
	snapshot_id: string;
	message_id: string;
	tool_call_id: string;
	turn_id: string;
	path: string;
	operation: ReviewOperation;
	status: ReviewStatus;
	state: ReviewState;
	additions: number | null;
	deletions: number | null;
	hunks: string[];
	binary: boolean;
	truncated: boolean;
	reversible: boolean;
}

/** `snapshot.rollback`'s answer (a CONFLICT or an unknown snapshot is a JSON-RPC error instead). */
export interface RollbackResult {
	ok: boolean;
	path: string | null;
	content: string;
}

const REVIEW_OPERATIONS: readonly string[] = ["write", "edit", "delete"];
const REVIEW_STATUSES: readonly string[] = ["added", "modified", "deleted"];

function countOrNull(value: unknown): number | null {
	return typeof value === "number" ? value : null;
}

/** A ToolResult's `review`, when it is a review record this extension can read. */
export function parseReview(value: unknown): ReviewChange | undefined {
	if (!isRecord(value)) return undefined;
	const { snapshot_id, path, operation, status } = value;
	if (typeof snapshot_id !== "string" || typeof path !== "string") return undefined;
	if (typeof operation !== "string" || !REVIEW_OPERATIONS.includes(operation)) return undefined;
	if (typeof status !== "string" || !REVIEW_STATUSES.includes(status)) return undefined;
	const toolCallId = typeof value.tool_call_id === "string" ? value.tool_call_id : "";
	return {
		version: typeof value.version === "number" ? value.version : 0,
		snapshot_id,
		message_id: typeof value.message_id === "string" ? value.message_id : toolCallId,
		tool_call_id: toolCallId,
		turn_id: typeof value.turn_id === "string" ? value.turn_id : "",
		path,
		operation: operation as ReviewOperation,
		status: status as ReviewStatus,
		state: value.state === "rolledBack" ? "rolledBack" : "active",
		additions: countOrNull(value.additions),
		deletions: countOrNull(value.deletions),
		hunks: Array.isArray(value.hunks) ? value.hunks.filter((h): h is string => typeof h === "string") : [],
		binary: value.binary === true,
		truncated: value.truncated === true,
		reversible: value.reversible === true,
	};
}

export type OutputStream = "stdout" | "stderr";

export interface ToolOutputParams {
	tool_call_id: string;
	stream: OutputStream;
	data: string;
}

export interface ApprovalRequest {
	session_id: string;
	tool_call_id: string;
	tool: string;
	operation: string;
	resource: string;
	reason: string;
	root?: string | null;
	turn_id?: string;
	rule_id?: string;
	external?: boolean;
	/** Whether "allow for this session" may be offered (default: yes). */
	allow_session?: boolean;
	/** The delegate (subagent) asking, when a delegate made the call (seed 003 §10.2). */
	delegate?: string;
	/** What "allow for this session" covers after a classifier's block ("git push"); absent: the tool. */
	session_scope?: string;
}

export type ApprovalDecision = "allow-once" | "allow-session" | "deny";

export const APPROVAL_DECISIONS: readonly ApprovalDecision[] = ["allow-once", "allow-session", "deny"];

function isRecord(value: unknown): value is Record<string, unknown> {
	return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function asRecord(value: unknown): Record<string, unknown> | undefined {
	return isRecord(value) ? value : undefined;
}

/** A `tool.call` result that is shaped like a ToolResult, or undefined. */
export function parseToolResult(value: unknown): ToolResult | undefined {
	if (!isRecord(value) || typeof value.ok !== "boolean" || typeof value.content !== "string") return undefined;
	const code = value.error_code;
	if (code !== null && code !== undefined && typeof code !== "string") return undefined;
	return {
		ok: value.ok,
		content: value.content,
		error_code: typeof code === "string" ? code : null,
		details: isRecord(value.details) ? value.details : {},
		root: (value.root as ToolResult["root"]) ?? null,
		review: isRecord(value.review) ? value.review : null,
	};
}

export function parseToolOutput(value: unknown): ToolOutputParams | undefined {
	if (!isRecord(value)) return undefined;
	const { tool_call_id, stream, data } = value;
	if (typeof tool_call_id !== "string" || typeof data !== "string") return undefined;
	if (stream !== "stdout" && stream !== "stderr") return undefined;
	return { tool_call_id, stream, data };
}

export function parseApprovalRequest(value: unknown): ApprovalRequest | undefined {
	if (!isRecord(value)) return undefined;
	const str = (key: string): string | undefined => (typeof value[key] === "string" ? (value[key] as string) : undefined);
	const session_id = str("session_id");
	const tool_call_id = str("tool_call_id");
	const tool = str("tool");
	if (session_id === undefined || tool_call_id === undefined || tool === undefined) return undefined;
	return {
		session_id,
		tool_call_id,
		tool,
		operation: str("operation") ?? "",
		resource: str("resource") ?? "",
		reason: str("reason") ?? "",
		root: str("root") ?? null,
		turn_id: str("turn_id"),
		rule_id: str("rule_id"),
		external: value.external === true,
		allow_session: value.allow_session !== false,
		...(str("delegate") ? { delegate: str("delegate") } : {}),
		...(str("session_scope") ? { session_scope: str("session_scope") } : {}),
	};
}
