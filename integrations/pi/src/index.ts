/**
 * pi extension: run pi's built-in tools (read, write, edit, bash, grep, find, ls) and the user's
 * `!` commands inside `sandbox serve`, and show the sandbox's approval requests in pi's UI.
 *
 * Fails closed: the tools are registered whether or not the server starts, so pi's host-side
 * built-ins are never used; when the server is missing, exits, errs or times out, the call
 * fails with the reason. A server that died is not restarted behind the user's back
 * (`/sandbox restart` does it).
 *
 *   pi -e ./integrations/pi            (see README.md)
 */

import { createPiClassifier } from "./classify.ts";
import type {
	ExtensionAPI,
	ExtensionContext,
	ExtensionToolContext,
	GrepToolInput,
	ToolDefinition,
} from "@earendil-works/pi-coding-agent";
import { execFile } from "node:child_process";
import { homedir } from "node:os";
import type { TSchema } from "typebox";
import {
	type AgentToolResult,
	createBashToolDefinition,
	DEFAULT_MAX_BYTES,
	DEFAULT_MAX_LINES,
	truncateTail,
	createEditToolDefinition,
	createFindToolDefinition,
	createGrepToolDefinition,
	createLsToolDefinition,
	createReadToolDefinition,
	createWriteToolDefinition,
} from "@earendil-works/pi-coding-agent";
import { SandboxError, SandboxUnavailableError } from "./errors.ts";
import { executeSandboxGrep } from "./grep.ts";
import { discoverManifests, explicitManifests, needsCheck, pluginFolders, pluginToolDefinition, registrationLine } from "./plugins.ts";
import {
	createSandboxBashOperations,
	createSandboxEditOperations,
	createSandboxFindOperations,
	createSandboxLsOperations,
	createSandboxReadOperations,
	createSandboxWriteOperations,
	callSandbox,
	observeResults,
	type SandboxCallContext,
} from "./operations.ts";
import type {
	ApprovalDecision,
	ApprovalRequest,
	Backend,
	MountStrategy,
	NetworkMode,
	OperatingMode,
	PermissionMode,
	SessionCloseResult,
	SessionConfigureResult,
	ToolResult,
} from "./protocol.ts";
import { countsLine, keptMessage, reviewChangeset } from "./review.ts";
import { isEditMismatch, RepairGuard, serverStop } from "./repair.ts";
import { observeReviews, ReviewLog, reviewNotice, rollbackCommand } from "./rollback.ts";
import { forkCommand, restoreCommand, snapshotCommand } from "./snapshots.ts";
import { type Approver, defaultSandboxBin, NO_ONE, SandboxSession } from "./session.ts";

export { SandboxClient } from "./client.ts";
export * from "./errors.ts";
export { executeSandboxGrep } from "./grep.ts";
export * from "./plugins.ts";
export * from "./operations.ts";
export type * from "./protocol.ts";
export { countsLine, keptMessage, type ReviewContext, type ReviewOutcome, reviewChangeset, reviewText } from "./review.ts";
export { observeReviews, ReviewLog, reviewNotice, type RollbackOutcome, rollbackCommand } from "./rollback.ts";
export { forkCommand, restoreCommand, type SnapshotOutcome, snapshotCommand } from "./snapshots.ts";
export { type Approver, type ApprovalVerdict, denyAll, NO_ONE, SandboxSession, type SandboxSessionOptions } from "./session.ts";

export interface SandboxExtensionConfig {
	bin: string;
	profile?: string;
	mode?: PermissionMode;
	backend?: Backend;
	mount?: MountStrategy;
	network?: NetworkMode;
	allowHosts?: string[];
	allowIndexes?: string[];
	/** `provider/model` judging the sandbox's classify requests (default: the session's model). */
	classifierModel?: string;
}

const MODES: readonly PermissionMode[] = ["ask", "accept-edits", "auto"];
const BACKENDS: readonly Backend[] = ["auto", "bwrap", "docker", "landlock", "microvm", "host"];
const MOUNTS: readonly MountStrategy[] = ["ro", "rw", "copy", "overlay"];
const NETWORKS: readonly NetworkMode[] = ["none", "allowlist", "host"];

function pick<T extends string>(name: string, value: string | undefined, allowed: readonly T[]): T | undefined {
	const v = value?.trim();
	if (!v) return undefined;
	if ((allowed as readonly string[]).includes(v)) return v as T;
	throw new SandboxError("INVALID_ARGUMENT", `${name}=${v} is not one of ${allowed.join(", ")}`);
}

/** Flags (`--sandbox-profile` ...) win over the environment (`SANDBOX_PROFILE` ...). */
export function resolveConfig(env: NodeJS.ProcessEnv, flag: (name: string) => string | undefined = () => undefined): SandboxExtensionConfig {
	return {
		bin: flag("sandbox-bin") || defaultSandboxBin(env),
		profile: flag("sandbox-profile") || env.SANDBOX_PROFILE?.trim() || undefined,
		mode: pick("sandbox mode", flag("sandbox-mode") || env.SANDBOX_MODE, MODES),
		backend: pick("sandbox backend", flag("sandbox-backend") || env.SANDBOX_BACKEND, BACKENDS),
		mount: pick("sandbox mount", flag("sandbox-mount") || env.SANDBOX_MOUNT, MOUNTS),
		network: pick("sandbox network", flag("sandbox-network") || env.SANDBOX_NETWORK, NETWORKS),
		allowHosts: (flag("sandbox-allow-host") || env.SANDBOX_ALLOW_HOSTS || "")
			.split(/[\s,]+/)
			.filter(Boolean),
		allowIndexes: (flag("sandbox-allow-index") || env.SANDBOX_ALLOW_INDEXES || "")
			.split(/[\s,]+/)
			.filter(Boolean),
		classifierModel: flag("sandbox-classifier-model") || env.SANDBOX_CLASSIFIER_MODEL?.trim() || undefined,
	};
}

// -- approvals in pi's UI -------------------------------------------------------------------------

const ALLOW_ONCE = "Allow once";
const ALLOW_SESSION = "Allow for this session";
const DENY = "Deny";

export function approvalTitle(request: ApprovalRequest): string {
	if (request.rule_id === "trust.ask") {
		return `Sandbox: trust this project and load its policy file ${request.resource} for this session?${request.reason ? `\n${request.reason}` : ""}`;
	}
	if (request.rule_id === "session.restore") {
		return `Sandbox: restore the session's view of the workspace (${request.resource})?${request.reason ? `\n${request.reason}` : ""}`;
	}
	const where = request.root && request.root !== "workspace" ? ` (${request.root})` : "";
	const what = [request.operation, request.resource].filter(Boolean).join(" ");
	// A delegate's call says which delegate asks (seed 003 §10.2).
	const who = request.delegate ? ` (asked by delegate ${request.delegate})` : "";
	return `Sandbox: allow ${request.tool}${who} to ${what}${where}?${request.reason ? `\n${request.reason}` : ""}`;
}

/** One dialog at a time: parallel tool calls queue their questions. */
class DialogQueue {
	private tail: Promise<unknown> = Promise.resolve();

	run<T>(job: () => Promise<T>): Promise<T> {
		const next = this.tail.then(job, job);
		this.tail = next.catch(() => undefined);
		return next;
	}
}

/** Without a dialog-capable UI (print and JSON modes) there is no one to ask: every approval is refused as such. */
export function createUiApprover(ctx: Pick<ExtensionContext, "hasUI" | "ui">, queue = new DialogQueue()): Approver {
	return (request, signal) => {
		if (!ctx.hasUI) return NO_ONE;
		return queue.run(async (): Promise<ApprovalDecision> => {
			if (signal.aborted) return "deny";
			// After a classifier's block, "for this session" covers that kind of call (seed 004), and says which.
			const session = request.session_scope ? `${ALLOW_SESSION}: ${request.session_scope}` : ALLOW_SESSION;
			const options = request.allow_session === false ? [ALLOW_ONCE, DENY] : [ALLOW_ONCE, session, DENY];
			const choice = await ctx.ui.select(approvalTitle(request), options, { signal });
			if (choice === ALLOW_ONCE) return "allow-once";
			if (choice === session) return "allow-session";
			return "deny";
		});
	};
}

// -- what the model reads of a bash call ----------------------------------------------------------

type Stream = "stdout" | "stderr";

/** One stream's tail within its share of pi's output limits, and a note when anything is left out. */
function streamText(server: ToolResult, stream: Stream, share: number): { text: string; note?: string } {
	const raw = typeof server.details[stream] === "string" ? (server.details[stream] as string) : "";
	const cut = truncateTail(raw, { maxBytes: Math.floor(DEFAULT_MAX_BYTES * share), maxLines: Math.floor(DEFAULT_MAX_LINES * share) });
	const total = typeof server.details[`${stream}_bytes`] === "number" ? (server.details[`${stream}_bytes`] as number) : cut.totalBytes;
	const captured = server.details[`${stream}_truncated`] === true;
	if (!cut.truncated && !captured) return { text: cut.content };
	return { text: cut.content, note: `[${stream}: the last ${cut.outputBytes} of ${total} bytes are shown]` };
}

/**
 * pi's bash result, with stdout and stderr told apart for the model when the command wrote to
 * stderr: `[stderr]` marks where it begins, each stream keeps its tail (stdout three quarters of
 * pi's limits, stderr a quarter) and says when it was cut; `structuredContent` gains `stdout` and
 * `stderr`. A command that wrote only to stdout keeps pi's own text.
 */
export function streamsApart<T>(result: AgentToolResult<T>, server: ToolResult | undefined): AgentToolResult<T> {
	const stderr = server?.details.stderr;
	if (!server || typeof stderr !== "string" || stderr === "") return result;
	const out = streamText(server, "stdout", 0.75);
	const err = streamText(server, "stderr", 0.25);
	const parts = [out.text.replace(/\n$/, ""), `[stderr]\n${err.text.replace(/\n$/, "")}`].filter((p) => p !== "");
	const notes = [out.note, err.note].filter((n): n is string => n !== undefined);
	const original = result.content.map((block) => (block.type === "text" ? block.text : "")).join("\n");
	const status = /\n\n(Command exited with code \d+)$/.exec(original)?.[1];
	const text = [parts.join("\n\n"), ...notes, ...(status ? [status] : [])].join("\n\n");
	const structured = result.structuredContent;
	const stdout = typeof server.details.stdout === "string" ? server.details.stdout : "";
	const apart = structured && typeof structured === "object" && !Array.isArray(structured) ? { ...structured, stdout, stderr } : structured;
	return { ...result, content: [{ type: "text", text }], ...(apart === undefined ? {} : { structuredContent: apart }) };
}

/** `/sandbox mode X`, `/sandbox plan|goal|agent`: the running session's modes, changed between calls (plan and goal from agent only). */
/** A `/sandbox mode|plan|goal|agent` change; `inherit` drops the session's own permission mode. */
type ModeChange = { mode?: PermissionMode | "inherit"; operating_mode?: OperatingMode };

/** The custom entry pi keeps in its session file for each mode change (replayed on resume). */
export const MODES_ENTRY = "sandbox-modes";

/** The modes a pi session's entries last chose (`undefined` where none did), to set again on resume. */
export function savedModes(entries: readonly unknown[]): ModeChange {
	const saved: ModeChange = {};
	for (const entry of entries) {
		const e = entry as { type?: unknown; customType?: unknown; data?: ModeChange };
		if (e?.type !== "custom" || e.customType !== MODES_ENTRY || !e.data) continue;
		if (e.data.mode) saved.mode = e.data.mode;
		if (e.data.operating_mode) saved.operating_mode = e.data.operating_mode;
	}
	return saved;
}

async function configureCommand(
	session: SandboxSession | undefined,
	change: ModeChange,
	ctx: Pick<ExtensionContext, "ui">,
	changed: (now: SessionConfigureResult) => void,
): Promise<void> {
	if (!session?.alive) {
		ctx.ui.notify("Sandbox: not running; `/sandbox restart` first.", "warning");
		return;
	}
	if (!change.mode && !change.operating_mode) {
		ctx.ui.notify(`Sandbox: /sandbox mode takes one of ${MODES.join(", ")}`, "warning");
		return;
	}
	try {
		const now = await session.configure(change);
		const notices = (now.notices ?? []).map((notice) => `\n${notice.message}`).join("");
		ctx.ui.notify(`Sandbox: permission mode ${now.mode}, operating mode ${now.operating_mode}${notices}`, notices ? "warning" : "info");
		ctx.ui.setStatus("sandbox", statusLine(session));
		changed(now);
	} catch (error) {
		ctx.ui.notify(`Sandbox: the mode was not changed: ${(error as Error).message}`, "error");
	}
}

/**
 * `/sandbox network`, `/sandbox allow HOST…`, `/sandbox disallow HOST…`: the running session's
 * allowlist, shown or changed between calls (an allowlist session only; the user typed it, so no
 * question follows; the server audits the change). A new host reaches the next command.
 */
async function networkCommand(
	session: SandboxSession | undefined,
	sub: string,
	hosts: string[],
	ctx: Pick<ExtensionContext, "ui">,
): Promise<void> {
	if (!session?.alive) {
		ctx.ui.notify("Sandbox: not running; `/sandbox restart` first.", "warning");
		return;
	}
	if (sub !== "network" && hosts.length === 0) {
		ctx.ui.notify(`Sandbox: /sandbox ${sub} takes one or more hosts (host, *.host, host:port, an IP or a CIDR)`, "warning");
		return;
	}
	try {
		const before = (await session.configure({})).network;
		let now = before;
		if (sub !== "network") {
			const current = before?.allow ?? [];
			const allow = sub === "allow" ? [...current, ...hosts.filter((h) => !current.includes(h))] : current.filter((h) => !hosts.includes(h));
			now = (await session.configure({ network: { allow } })).network;
		}
		const shown = now ? `${now.mode}: ${now.allow.length ? now.allow.join(", ") : "(nothing allowed)"}` : "unknown";
		ctx.ui.notify(`Sandbox: network ${shown}`, "info");
	} catch (error) {
		ctx.ui.notify(`Sandbox: the network was not changed: ${(error as Error).message}`, "error");
	}
}

/**
 * `/sandbox policy …` and `/sandbox audit …`: seed 004's `/safety` set inside pi (show the rules,
 * the mode and the paths; test a call; allow, block or ask; stats), through the `sandbox` CLI
 * itself, so pi and the terminal share one store. A rule saved here reaches the running session
 * at its next call.
 */
async function cliCommand(bin: string, words: string[], ctx: Pick<ExtensionContext, "ui">): Promise<void> {
	if (words.length < 2) {
		ctx.ui.notify("Sandbox: /sandbox policy list|test|allow|block|ask|remove|restore|mode …, /sandbox audit stats|network", "warning");
		return;
	}
	const outcome = await new Promise<{ code: number; out: string }>((resolve) => {
		execFile(bin, words, { timeout: 30_000, maxBuffer: 1 << 20 }, (error, stdout, stderr) => {
			const code = error ? (typeof error.code === "number" ? error.code : 1) : 0;
			resolve({ code, out: `${stdout}${stderr}`.trim() });
		});
	});
	ctx.ui.notify(`sandbox ${words.join(" ")}\n${outcome.out || "(no output)"}`, outcome.code === 0 ? "info" : "warning");
}

/**
 * A command line's words as a POSIX shell splits them (no expansion): blanks separate, `"…"` and
 * `'…'` keep a phrase one word, a backslash keeps the next character (inside `"…"` only before `"`,
 * `\\`, `$` and a backquote). So `/sandbox policy allow "npm install"` saves the rule `npm install`,
 * and `/sandbox policy test "git push --force"` judges that whole command. An unclosed quote is an error.
 */
export function shellWords(line: string): string[] {
	const words: string[] = [];
	let word: string | undefined;
	let quote: '"' | "'" | undefined;
	for (let i = 0; i < line.length; i++) {
		const c = line[i] as string;
		if (quote === "'") {
			if (c === "'") quote = undefined;
			else word = (word ?? "") + c;
		} else if (c === "\\" && i + 1 < line.length && (quote === undefined || '"\\$`'.includes(line[i + 1] as string))) {
			word = (word ?? "") + line[++i];
		} else if (quote === '"') {
			if (c === '"') quote = undefined;
			else word = (word ?? "") + c;
		} else if (c === '"' || c === "'") {
			quote = c;
			word ??= "";
		} else if (/\s/.test(c)) {
			if (word !== undefined) words.push(word);
			word = undefined;
		} else {
			word = (word ?? "") + c;
		}
	}
	if (quote) throw new Error(`unclosed ${quote} in: ${line}`);
	if (word !== undefined) words.push(word);
	return words;
}

const ANSWERED: Record<string, string> = {
	"allow-once": "allowed once",
	"allow-session": "allowed for this session",
	deny: "denied",
};
const BY: Record<string, string> = { user: "by you", timeout: "(no answer in time)", client: "by the client for you" };

/**
 * One call's approval record (the server's `details.approval`, redacted there) as pi shows it:
 * `Sandbox: allowed once by you: git push origin main (rule shell.command, answered in 1.2 s)`.
 */
export function approvalLine(record: unknown): string | undefined {
	if (typeof record !== "object" || record === null) return undefined;
	const r = record as { answer?: unknown; decided_by?: unknown; resource?: unknown; rule_id?: unknown; wait_ms?: unknown };
	const answered = ANSWERED[String(r.answer)] ?? "not allowed";
	const by = BY[String(r.decided_by)] ?? `(${String(r.decided_by)})`;
	const waited = typeof r.wait_ms === "number" ? `, answered in ${(r.wait_ms / 1000).toFixed(1)} s` : "";
	return `Sandbox: ${answered} ${by}: ${String(r.resource)} (rule ${String(r.rule_id)}${waited})`;
}

/** The footer: profile, backend/mount, and the modes in force now (plan and goal named). */
export function statusLine(session: SandboxSession): string {
	const { profile, backend, mount, mode, operating_mode: operating } = session.info;
	return `sandbox: ${profile} ${backend}/${mount} ${mode}${operating && operating !== "agent" ? ` ${operating}` : ""}`;
}

/**
 * Plan and goal show the model only their tools (seed 003: Read, Glob, Grep, LS and Bash): pi's
 * active tool set loses write, edit and every sandbox plugin tool while the session is in either,
 * and gets back exactly what this took away when it returns to agent. The server refuses them
 * anyway; hiding them keeps the model from planning with tools it cannot use.
 */
export class ModeTools {
	private readonly hidden = new Set<string>();

	constructor(
		private readonly pi: Pick<ExtensionAPI, "getActiveTools" | "setActiveTools">,
		private readonly plugins: () => Iterable<string>,
	) {}

	apply(operatingMode: string | undefined): void {
		if (typeof this.pi.getActiveTools !== "function" || typeof this.pi.setActiveTools !== "function") return;
		const active = this.pi.getActiveTools();
		if (!operatingMode || operatingMode === "agent") {
			const back = [...this.hidden].filter((name) => !active.includes(name));
			this.hidden.clear();
			if (back.length > 0) this.pi.setActiveTools([...active, ...back]);
			return;
		}
		const hide = new Set(["write", "edit", ...this.plugins()]);
		const kept = active.filter((name) => !hide.has(name));
		for (const name of active) if (hide.has(name)) this.hidden.add(name);
		if (kept.length !== active.length) this.pi.setActiveTools(kept);
	}
}

// -- failures without a UI ------------------------------------------------------------------------

const said = new Set<string>();

/**
 * Without a UI (print and JSON modes) nobody sees a notice: a sandbox that cannot start, a bad
 * flag value or a lost server is written to stderr, once, and pi exits non-zero (pi's print mode
 * leaves `process.exitCode` alone when its own run succeeded). The model still reads why each
 * call failed.
 */
export function loud(message: string): void {
	if (said.has(message)) return;
	said.add(message);
	process.stderr.write(`sandbox: ${message}\n`);
	process.exitCode = 1;
}

// -- the session's lifetime -----------------------------------------------------------------------

class SandboxManager {
	private session: SandboxSession | undefined;
	private starting: Promise<SandboxSession> | undefined;
	private lost: SandboxError | undefined;
	/** `/sandbox profile NAME`: the profile the next session opens with, over the configured one. */
	private profileOverride: string | undefined;

	constructor(
		private readonly config: () => SandboxExtensionConfig,
		/** The plugin manifests a session opened in `cwd` declares (see plugins.ts). */
		private readonly manifests: (cwd: string) => string[] = () => [],
	) {}

	get current(): SandboxSession | undefined {
		return this.session;
	}

	async ensure(ctx: ExtensionContext): Promise<SandboxSession> {
		if (this.session) {
			if (this.session.alive) return this.session;
			this.lost = this.session.client.error ?? new SandboxUnavailableError("the sandbox server stopped");
			this.session = undefined;
			ctx.ui.setStatus("sandbox", "sandbox: DOWN");
			if (ctx.hasUI) ctx.ui.notify(`Sandbox server lost; tools are disabled. /sandbox restart starts a new one.\n${this.lost.message}`, "error");
			else loud(`the sandbox server was lost; every later sandboxed tool call fails: ${this.lost.message}`);
		}
		if (this.lost) {
			throw new SandboxUnavailableError(`${this.lost.message}\nThe sandboxed tools stay disabled until /sandbox restart.`);
		}
		this.starting ??= this.start(ctx).finally(() => {
			this.starting = undefined;
		});
		return this.starting;
	}

	private async start(ctx: ExtensionContext): Promise<SandboxSession> {
		const config = this.config();
		const session = await SandboxSession.open({
			bin: config.bin,
			workspace: ctx.cwd,
			profile: this.profileOverride ?? config.profile,
			mode: config.mode,
			backend: config.backend,
			mount: config.mount,
			network: config.network,
			allowHosts: config.allowHosts,
			allowIndexes: config.allowIndexes,
			onDenial: (denial) => {
				if (ctx.hasUI) ctx.ui.notify(denial.line, "warning");
			},
			trustApprover: createUiApprover(ctx),
			plugins: this.manifests(ctx.cwd),
			clientName: "pi",
			classify: createPiClassifier(ctx, config.classifierModel),
		});
		this.session = session;
		this.tell(session, ctx);
		ctx.ui.setStatus("sandbox", statusLine(session));
		return session;
	}

	private readonly told = new Set<string>();

	/** What the session said when it opened (a policy file ignored: the project is not trusted), once. */
	private tell(session: SandboxSession, ctx: ExtensionContext): void {
		for (const notice of session.info.notices ?? []) {
			const key = `${notice.code}\0${notice.file ?? notice.message}`;
			if (this.told.has(key)) continue;
			this.told.add(key);
			if (ctx.hasUI) ctx.ui.notify(`Sandbox: ${notice.message}`, "warning");
			else process.stderr.write(`sandbox: ${notice.message}\n`);
		}
	}

	/** Stop the server; a copy/overlay session's changes are kept first (`changeset_id`). */
	async stop(): Promise<SessionCloseResult | undefined> {
		const session = this.session;
		this.session = undefined;
		const starting = this.starting;
		this.starting = undefined;
		const ended = await session?.end();
		await session?.close();
		await starting?.then((s) => s.close()).catch(() => undefined);
		return ended;
	}

	/**
	 * End the live session for a review and keep its server (which serves the review); the next
	 * call starts a fresh session, whose private copy starts from the workspace as it is then.
	 */
	async endForReview(): Promise<{ session: SandboxSession; ended: SessionCloseResult | undefined } | undefined> {
		const session = this.session;
		if (!session?.alive) return undefined;
		this.session = undefined;
		return { session, ended: await session.end() };
	}

	async restart(ctx: ExtensionContext): Promise<SandboxSession> {
		await this.stop();
		this.lost = undefined;
		return this.ensure(ctx);
	}

	/**
	 * A profile switch reaches the running pi session: between calls, the sandbox session ends (a
	 * copy session's changes kept as a changeset, as at exit) and a new one opens with `profile`;
	 * a profile that cannot open leaves the earlier profile in place (and its new session).
	 */
	async switchProfile(profile: string, ctx: ExtensionContext): Promise<{ session: SandboxSession; ended: SessionCloseResult | undefined }> {
		const before = this.profileOverride;
		const ended = await this.stop();
		this.lost = undefined;
		this.profileOverride = profile;
		try {
			return { session: await this.ensure(ctx), ended };
		} catch (error) {
			this.profileOverride = before;
			await this.ensure(ctx).catch(() => undefined);
			throw error;
		}
	}
}

const COPYING = new Set(["copy", "overlay"]);
/** Said to the model after a write or edit in a copy/overlay session (the server's Write says the same). */
export const PRIVATE_COPY_NOTE =
	"(Written in the sandbox's private copy of the workspace, not the workspace itself: the user reviews the session's changes and applies them to keep them.)";

/** `/sandbox review`: this session's private copy, or a changeset kept earlier, reviewed and applied. */
async function reviewCommand(manager: SandboxManager, ctx: ExtensionContext): Promise<void> {
	const session = manager.current;
	if (!session?.alive) {
		ctx.ui.notify("Sandbox: not running; `/sandbox restart` first (kept changesets also: sandbox changes list).", "warning");
		return;
	}
	const live = COPYING.has(session.info.mount) ? await session.pending() : undefined;
	const kept = (await session.listChanges()).filter((c) => c.state !== "applied");
	const LIVE = live && live.changes.length > 0 ? `This session's private copy: ${countsLine(live.counts)} (ends the copy; the next call starts a fresh one)` : undefined;
	const choices = new Map(kept.map((c) => [`${c.id}  ${c.created.replace("T", " ").slice(0, 16)}  ${c.state}  (${countsLine(c.counts)})`, c.id]));
	const options = [...(LIVE ? [LIVE] : []), ...choices.keys()];
	if (options.length === 0) {
		ctx.ui.notify("Sandbox: nothing to review; no changes wait in a private copy or a kept changeset.", "info");
		return;
	}
	if (!ctx.hasUI) {
		for (const c of kept) process.stderr.write(keptMessage(c.id, c.counts));
		return;
	}
	const choice = options.length === 1 ? options[0] : await ctx.ui.select("Sandbox: review which changes?", options);
	if (choice === undefined) return;
	if (choice !== LIVE) {
		await reviewChangeset(session, choices.get(choice) ?? choice, ctx);
		return;
	}
	const frozen = await manager.endForReview();
	try {
		const id = frozen?.ended?.changeset_id;
		if (!id) ctx.ui.notify("Sandbox: the session ended but the server kept no changeset (nothing changed, or it failed: see sandbox changes list).", "warning");
		else await reviewChangeset(frozen.session, id, ctx);
	} finally {
		await frozen?.session.close();
		await manager.ensure(ctx).catch(() => undefined);
	}
}

/** After an agent run: say, once per new count, that changes wait in the private copy. */
async function remindPending(manager: SandboxManager, ctx: ExtensionContext, last: { count: number }): Promise<void> {
	const session = manager.current;
	if (!ctx.hasUI || !session?.alive || !COPYING.has(session.info.mount)) return;
	const pending = await session.pending();
	const count = pending.changes.length;
	if (count === 0 || count === last.count) return;
	last.count = count;
	ctx.ui.notify(`Sandbox: ${countsLine(pending.counts)} wait in the private copy, not in the workspace. /sandbox review shows and applies them.`, "info");
}

// -- the extension --------------------------------------------------------------------------------

export default function sandboxExtension(pi: ExtensionAPI): void {
	pi.registerFlag("sandbox-bin", { type: "string", description: "The sandbox executable (default: $SANDBOX_BIN, else sandbox on PATH)" });
	pi.registerFlag("sandbox-profile", { type: "string", description: "Sandbox profile (default: $SANDBOX_PROFILE, else the server's default)" });
	pi.registerFlag("sandbox-classifier-model", {
		type: "string",
		description: "provider/model judging the sandbox's classify requests (default: $SANDBOX_CLASSIFIER_MODEL, else the session's model)",
	});
	pi.registerFlag("sandbox-mode", { type: "string", description: "Permission mode: ask, accept-edits or auto (default: $SANDBOX_MODE)" });
	pi.registerFlag("sandbox-backend", { type: "string", description: "auto, bwrap, docker or host (default: $SANDBOX_BACKEND)" });
	pi.registerFlag("sandbox-mount", { type: "string", description: "ro, rw, copy or overlay (default: $SANDBOX_MOUNT)" });
	pi.registerFlag("sandbox-network", { type: "string", description: "none, allowlist or host (default: $SANDBOX_NETWORK, else the profile's)" });
	pi.registerFlag("sandbox-allow-host", {
		type: "string",
		description: "Hosts the jail may reach through the filtering proxy, comma-separated (implies allowlist; default: $SANDBOX_ALLOW_HOSTS)",
	});
	pi.registerFlag("sandbox-allow-index", {
		type: "string",
		description: "Package indexes the jail may reach, comma-separated: pypi, npm, crates, go or NAME=URL (implies allowlist; default: $SANDBOX_ALLOW_INDEXES)",
	});

	const flag = (name: string): string | undefined => {
		const value = pi.getFlag(name);
		return typeof value === "string" ? value : undefined;
	};
	pi.registerFlag("sandbox-plugin", {
		type: "string",
		description: "Sandbox plugin manifests, ':'-separated (also $SANDBOX_PLUGINS, .pi/sandbox-plugins/, ~/.pi/agent/sandbox-plugins/)",
	});
	const manifests = (cwd: string): string[] =>
		discoverManifests(explicitManifests(process.env.SANDBOX_PLUGINS, flag("sandbox-plugin")), pluginFolders(cwd, homedir()));
	const manager = new SandboxManager(() => resolveConfig(process.env, flag), manifests);
	const dialogs = new DialogQueue();
	const cwd = process.cwd();

	// One turn per user prompt (seed 004: a denied call is not asked again in the same turn).
	const turns = { count: 0 };
	const turnId = (): string => `pi-turn-${turns.count}`;
	const latest = { prompt: undefined as string | undefined }; // the user's latest message, for the classifier
	// Every call someone was asked about leaves its approval record in pi's UI (seed 000: kept, redacted).
	const callContext = (ctx: ExtensionContext, signal: AbortSignal | undefined, idPrefix: string): SandboxCallContext =>
		observeResults(
			{
				session: () => manager.ensure(ctx),
				approver: createUiApprover(ctx, dialogs),
				signal,
				idPrefix,
				turnId: turnId(),
				userMessage: latest.prompt,
			},
			(_session, result) => {
				const line = approvalLine(result.details.approval);
				if (line && ctx.hasUI) ctx.ui.notify(line, "info");
			},
		);

	// The tools this extension provides (pi's seven, routed to the sandbox, and registered plugin tools).
	const ours = new Set<string>();
	// Each override keeps pi's own definition (schema, prompt text, renderers) and swaps the operations.
	const register = <TParams extends TSchema, TDetails, TState>(
		base: ToolDefinition<TParams, TDetails, TState>,
		withOps: (c: SandboxCallContext, ctx: ExtensionToolContext) => Pick<ToolDefinition<TParams, TDetails, TState>, "execute">,
	): void => {
		ours.add(base.name);
		pi.registerTool<TParams, TDetails, TState>({
			...base,
			execute: (id, params, signal, onUpdate, ctx) => withOps(callContext(ctx, signal, id), ctx).execute(id, params, signal, onUpdate, ctx),
		});
	};

	register(createReadToolDefinition(cwd), (c, ctx) => createReadToolDefinition(ctx.cwd, { operations: createSandboxReadOperations(c) }));
	// pi's own write and edit say "Successfully wrote…"; in a copy/overlay session the model is told where.
	const inCopy = <TParams extends TSchema, TDetails, TState>(
		tool: Pick<ToolDefinition<TParams, TDetails, TState>, "execute">,
	): Pick<ToolDefinition<TParams, TDetails, TState>, "execute"> => ({
		execute: async (...args) => {
			const result = await tool.execute(...args);
			if (!COPYING.has(manager.current?.info.mount ?? "")) return result;
			return { ...result, content: [...result.content, { type: "text", text: PRIVATE_COPY_NOTE }] };
		},
	});
	// A write or edit's review record is told to the user and remembered for /sandbox rollback.
	const reviews = new ReviewLog();
	const reviewed = (c: SandboxCallContext, ctx: ExtensionToolContext): SandboxCallContext =>
		observeReviews(c, (session, review) => {
			reviews.note(session.info.session_id, review);
			if (ctx.hasUI) ctx.ui.notify(reviewNotice(review, session.info.workspace), "info");
		});
	register(createWriteToolDefinition(cwd), (c, ctx) => inCopy(createWriteToolDefinition(ctx.cwd, { operations: createSandboxWriteOperations(reviewed(c, ctx)) })));
	// The repair loop's end (seed 003 §4d): a second failed edit of a path in a turn stops pi's loop.
	const repairs = new RepairGuard();
	register(createEditToolDefinition(cwd), (c, ctx) => {
		const tool = inCopy(createEditToolDefinition(ctx.cwd, { operations: createSandboxEditOperations(reviewed(c, ctx)) }));
		return {
			execute: async (...args) => {
				try {
					return await tool.execute(...args);
				} catch (error) {
					if (!isEditMismatch(error)) throw error;
					const failure = repairs.editFailed(c.turnId ?? "", String((args[1] as { path?: unknown }).path ?? ""));
					const text = `${(error as Error).message}\n${failure.note}`;
					if (!failure.terminate) throw new Error(text, { cause: error });
					const { note: _note, ...details } = failure;
					return { content: [{ type: "text", text }], details: details as never, isError: true, terminate: true };
				}
			},
		};
	});
	register(createLsToolDefinition(cwd), (c, ctx) => createLsToolDefinition(ctx.cwd, { operations: createSandboxLsOperations(c) }));
	register(createFindToolDefinition(cwd), (c, ctx) => createFindToolDefinition(ctx.cwd, { operations: createSandboxFindOperations(c) }));
	// pi's PI_* variables are not forwarded into the jail (the server sets PI_SCRATCH_DIR itself), so
	// pi's hint about them is left out. pi's bash
	// merges the two streams; the model gets them apart (streamsApart) from the server's result.
	register(createBashToolDefinition(cwd, { exposeSessionEnvironment: false }), (c, ctx) => {
		let server: ToolResult | undefined;
		const operations = createSandboxBashOperations(c, { onResult: (result) => (server = result) });
		const tool = createBashToolDefinition(ctx.cwd, { operations, exposeSessionEnvironment: false });
		return {
			execute: async (...args) => {
				const result = streamsApart(await tool.execute(...args), server);
				// The server ended a patch-command repair loop: say why, and stop pi's loop after the batch.
				const stop = serverStop(server);
				if (stop === undefined) return result;
				return { ...result, content: [...result.content, { type: "text", text: stop }], terminate: true };
			},
		};
	});
	register(createGrepToolDefinition(cwd), (c, ctx) => ({
		execute: (_id: string, params: GrepToolInput, signal: AbortSignal | undefined) => executeSandboxGrep(c, ctx.cwd, params, signal),
	}));

	// Plan and goal hide write, edit and the plugin tools from the model (and agent gives them back).
	const pluginNames = new Set<string>();
	const modeTools = new ModeTools(pi, () => pluginNames);

	// Plugin tools (seed 003 §11): each declared plugin is registered only after the user's grant
	// (the server asks through pi's dialog); its tools then run their command inside the jail.
	const registerPlugins = async (session: SandboxSession, ctx: ExtensionContext): Promise<void> => {
		for (const declared of session.info.plugins ?? []) {
			const plugin = declared.registered
				? declared
				: await session
						.registerPlugin(declared.id, { approver: createUiApprover(ctx, dialogs), turnId: turnId() })
						.catch((error: Error) => ({ ...declared, reason: error.message }));
			if (ctx.hasUI) ctx.ui.notify(registrationLine(plugin), plugin.registered ? "info" : "warning");
			if (!plugin.registered) continue;
			for (const tool of plugin.tools) {
				pluginNames.add(tool.name);
				if (ours.has(tool.name)) continue;
				ours.add(tool.name);
				pi.registerTool(pluginToolDefinition(tool, (params, signal, id, toolCtx) => callSandbox(callContext(toolCtx, signal, id), tool.name, params)));
			}
		}
	};

	// Another extension's tool (or an MCP server's) runs in pi's process: the sandbox's gate decides
	// first (policy, the user's approval, the audit). A refusal, or no server, blocks it (fail closed).
	pi.on("tool_call", async (event, ctx) => {
		const all = typeof pi.getAllTools === "function" ? pi.getAllTools() : undefined;
		if (!needsCheck(event.toolName, ours, all)) return undefined;
		try {
			const session = await manager.ensure(ctx);
			const input = event.input && typeof event.input === "object" ? (event.input as Record<string, unknown>) : {};
			const verdict = await session.checkTool(event.toolName, input, {
				approver: createUiApprover(ctx, dialogs),
				turnId: turnId(),
				idPrefix: event.toolCallId,
			});
			return verdict.ok ? undefined : { block: true, reason: `sandbox: ${verdict.content}` };
		} catch (error) {
			return { block: true, reason: `sandbox: ${event.toolName} was not checked, so it does not run: ${(error as Error).message}` };
		}
	});

	pi.on("user_bash", (_event, ctx) => ({
		operations: createSandboxBashOperations(callContext(ctx, ctx.signal, "user-bash")),
	}));

	pi.on("session_start", async (_event, ctx) => {
		try {
			const session = await manager.ensure(ctx);
			await registerPlugins(session, ctx);
			// A resumed pi session gets back the modes it chose (a new sandbox session starts from the profile's).
			const saved = savedModes(ctx.sessionManager?.getEntries?.() ?? []);
			if (saved.mode || saved.operating_mode) {
				const agentFirst = saved.operating_mode && session.info.operating_mode !== "agent" ? { operating_mode: "agent" as const } : undefined;
				if (agentFirst) await session.configure(agentFirst);
				await session.configure(saved);
				ctx.ui.setStatus("sandbox", statusLine(session));
			}
			modeTools.apply(session.info.operating_mode);
			const kept = (await session.listChanges().catch(() => [])).filter((c) => c.state !== "applied");
			if (kept.length > 0 && ctx.hasUI) {
				ctx.ui.notify(`Sandbox: ${kept.length} changeset(s) kept from earlier sessions of this workspace wait for review: /sandbox review`, "info");
			}
		} catch (error) {
			ctx.ui.setStatus("sandbox", "sandbox: DOWN");
			if (ctx.hasUI) ctx.ui.notify(`Sandbox unavailable; the sandboxed tools will fail until it starts.\n${(error as Error).message}`, "error");
			else loud(`the sandbox is unavailable; every sandboxed tool call fails: ${(error as Error).message}`);
		}
	});

	// pi has stopped its UI by now (quit) or is switching sessions: nothing is asked here. The
	// server keeps a copy/overlay session's changes; say where, on stderr, which outlives the TUI.
	pi.on("session_shutdown", async () => {
		const ended = await manager.stop();
		if (ended?.changeset_id) process.stderr.write(keptMessage(ended.changeset_id, ended.counts));
	});

	// Before /new, /resume or a fork the UI is still up: offer the review of the private copy.
	const offerReview = async (_event: unknown, ctx: ExtensionContext): Promise<undefined> => {
		const session = manager.current;
		if (!ctx.hasUI || !session?.alive || !COPYING.has(session.info.mount)) return undefined;
		const pending = await session.pending().catch(() => undefined);
		if (pending && pending.changes.length > 0) await reviewCommand(manager, ctx).catch((error: Error) => ctx.ui.notify(`Sandbox review failed: ${error.message}`, "error"));
		return undefined;
	};
	pi.on("session_before_switch", offerReview);
	pi.on("session_before_fork", offerReview);

	const reminded = { count: 0 };
	pi.on("agent_settled", async (_event, ctx) => {
		await remindPending(manager, ctx, reminded).catch(() => undefined);
	});

	// The footer follows a global change (`/sandbox policy mode auto`, or `sandbox policy mode` in a
	// terminal): the session follows the user's global mode as it changes, so the footer asks again.
	const refreshStatus = async (ctx: Pick<ExtensionContext, "ui">): Promise<void> => {
		const session = manager.current;
		if (!session?.alive) return;
		await session.configure({}).then(
			() => ctx.ui.setStatus("sandbox", statusLine(session)),
			() => undefined, // a call in flight (CONFLICT): the next turn asks again
		);
	};

	pi.on("before_agent_start", async (event, ctx) => {
		await refreshStatus(ctx);
		if (event.messageType !== "custom") turns.count += 1; // a user's prompt opens a turn
		if (event.messageType === "user") latest.prompt = event.prompt;
		const info = manager.current?.info;
		if (!info) return undefined;
		const note =
			`Tools run inside an OS-level sandbox (profile ${info.profile}, ${info.backend}, workspace ${info.workspace} mounted ${info.mount}). ` +
			"Paths outside the workspace and network access may be refused; a refusal is a policy decision, not a bug to work around. " +
			`For temporary files (one-off scripts, downloads, drafts) use the session's scratch directory ${info.scratch_dir}, not the workspace: ` +
			"address it by absolute path (relative paths resolve against the workspace); Bash has it as $PI_SCRATCH_DIR. " +
			"It is removed when the session ends." +
			(COPYING.has(info.mount)
				? " Your changes land in a private copy of the workspace; the user reviews them and applies them to the workspace to keep them."
				: "");
		return { systemPrompt: `${event.systemPrompt}\n\n${note}` };
	});

	pi.registerCommand("sandbox", {
		description:
			"Sandbox status; `/sandbox review` shows and applies kept changes; `/sandbox rollback [SNAPSHOT_ID]` undoes a write or edit (default: the last); `/sandbox snapshot` keeps the session's state under an id, `/sandbox restore ID [--force]` returns to it, `/sandbox fork N` opens N sessions from its state now (copy and overlay mounts); `/sandbox mode ask|accept-edits|auto` and `/sandbox plan|goal|agent` change the running session's modes (plan and goal from agent only); `/sandbox profile NAME` switches the profile (a new sandbox session; copy work kept); `/sandbox network`, `/sandbox allow HOST…`, `/sandbox disallow HOST…` show or change an allowlist session's network; `/sandbox restart` starts a new sandbox server",
		handler: async (args, ctx) => {
			let words: string[];
			try {
				words = shellWords(args);
			} catch (error) {
				ctx.ui.notify(`Sandbox: ${(error as Error).message}`, "warning");
				return;
			}
			const [sub = "", ...rest] = words;
			if (sub === "policy" || sub === "audit") {
				await cliCommand(resolveConfig(process.env, flag).bin, [sub, ...rest], ctx);
				await refreshStatus(ctx);
				return;
			}
			if (sub === "mode" || sub === "plan" || sub === "goal" || sub === "agent") {
				let change: ModeChange;
				try {
					change = sub === "mode" ? { mode: pick("sandbox mode", rest[0], [...MODES, "inherit"]) } : { operating_mode: sub };
				} catch (error) {
					ctx.ui.notify(`Sandbox: ${(error as Error).message}`, "warning");
					return;
				}
				await configureCommand(manager.current, change, ctx, (now) => {
					modeTools.apply(now.operating_mode);
					// Kept with pi's session: a resumed one gets its modes back.
					if (typeof pi.appendEntry === "function") pi.appendEntry(MODES_ENTRY, change);
				});
				return;
			}
			if (sub === "network" || sub === "allow" || sub === "disallow") {
				await networkCommand(manager.current, sub, rest, ctx);
				return;
			}
			if (sub === "rollback") {
				await rollbackCommand(manager.current, reviews, rest.join(" "), ctx.ui);
				return;
			}
			if (sub === "snapshot") {
				await snapshotCommand(manager.current, ctx.ui);
				return;
			}
			if (sub === "restore") {
				const restored = await restoreCommand(manager.current, rest, ctx.ui, { approver: createUiApprover(ctx, dialogs), turnId: turnId() });
				// The snapshot's modes came back with it.
				const session = manager.current;
				if (restored === "restored" && session) {
					ctx.ui.setStatus("sandbox", statusLine(session));
					modeTools.apply(session.info.operating_mode);
				}
				return;
			}
			if (sub === "fork") {
				await forkCommand(manager.current, rest, ctx.ui, { turnId: turnId() });
				return;
			}
			if (args.trim() === "review") {
				await reviewCommand(manager, ctx).catch((error: Error) => ctx.ui.notify(`Sandbox review failed: ${error.message}`, "error"));
				return;
			}
			if (sub === "profile") {
				if (!rest[0]) {
					ctx.ui.notify(`Sandbox: profile ${manager.current?.info.profile ?? "(none running)"}; /sandbox profile NAME|FILE switches`, "info");
					return;
				}
				try {
					const { session, ended } = await manager.switchProfile(rest[0], ctx);
					const kept = ended?.changeset_id ? `; the earlier session's changes are kept as changeset ${ended.changeset_id}` : "";
					ctx.ui.notify(`Sandbox: profile ${session.info.profile} now (a new sandbox session, ${session.info.backend}/${session.info.mount})${kept}`, "info");
					await registerPlugins(session, ctx);
					modeTools.apply(session.info.operating_mode);
				} catch (error) {
					ctx.ui.notify(`Sandbox: the profile was not switched: ${(error as Error).message}`, "error");
				}
				return;
			}
			if (args.trim() === "restart") {
				try {
					const session = await manager.restart(ctx);
					ctx.ui.notify(`Sandbox restarted: session ${session.info.session_id}`, "info");
				} catch (error) {
					ctx.ui.notify(`Sandbox restart failed: ${(error as Error).message}`, "error");
				}
				return;
			}
			const session = manager.current;
			if (!session?.alive) {
				ctx.ui.notify("Sandbox: not running. The sandboxed tools fail until `/sandbox restart` succeeds.", "warning");
				return;
			}
			const { session_id, workspace, scratch_dir, backend, mount, profile, mode } = session.info;
			ctx.ui.notify(
				[
					`Sandbox server ${session.server.version} (pid ${session.pid ?? "?"})`,
					`session ${session_id}, profile ${profile}, mode ${mode}`,
					`backend ${backend}, workspace ${workspace} (${mount})`,
					`scratch ${scratch_dir}`,
				].join("\n"),
				"info",
			);
		},
	});
}
