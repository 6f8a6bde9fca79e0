/**
 * Session snapshots in pi (issue 39): `/sandbox snapshot` keeps the session's file state (its view
 * of the workspace, its scratch directory and its modes) under an id, `/sandbox restore ID [--force]`
 * brings the session back to it, and `/sandbox fork N` opens N sessions from its state now.
 *
 * pi drives one sandbox session: a fork is a session the server serves under its own id, which this
 * extension cannot switch to. `/sandbox fork` says so, and names the snapshot the forks started from,
 * which `/sandbox restore` returns this session to later.
 */

import type { ExtensionUIContext } from "@earendil-works/pi-coding-agent";
import { SandboxError, SandboxRpcError } from "./errors.ts";
import { printable } from "./review.ts";
import type { Approver, SandboxSession } from "./session.ts";

export type SnapshotOutcome = "taken" | "restored" | "forked" | "conflict" | "denied" | "refused" | "usage" | "not-running" | "failed";

type Notify = Pick<ExtensionUIContext, "notify">;

/** The most paths a conflict notice names. */
const SHOWN_PATHS = 10;

function paths(list: readonly string[]): string {
	const shown = list.slice(0, SHOWN_PATHS).map((p) => printable(p));
	return list.length > SHOWN_PATHS ? `${shown.join(", ")} and ${list.length - SHOWN_PATHS} more` : shown.join(", ");
}

/** A CONFLICT's paths the host changed: the server's error data is `{code, message, data: {snapshot_id, paths}}`. */
function conflictPaths(error: unknown): string[] {
	if (!(error instanceof SandboxRpcError) || typeof error.data !== "object" || error.data === null) return [];
	const inner = (error.data as { data?: unknown }).data;
	const paths = typeof inner === "object" && inner !== null ? (inner as { paths?: unknown }).paths : undefined;
	return Array.isArray(paths) ? paths.filter((p): p is string => typeof p === "string") : [];
}

function plural(count: number, one: string): string {
	return `${count} ${one}${count === 1 ? "" : "s"}`;
}

/** The server said no (the session cannot do it now, or at all), as opposed to a failure. */
function refusal(error: unknown): boolean {
	return error instanceof SandboxError && (error.code === "INVALID_ARGUMENT" || error.code === "CONFLICT");
}

function running(session: SandboxSession | undefined, ui: Notify): session is SandboxSession {
	if (session?.alive) return true;
	ui.notify("Sandbox: not running; `/sandbox restart` first.", "warning");
	return false;
}

/** `/sandbox snapshot`: the session's state kept under an id, and what it holds. */
export async function snapshotCommand(session: SandboxSession | undefined, ui: Notify): Promise<SnapshotOutcome> {
	if (!running(session, ui)) return "not-running";
	try {
		const snap = await session.snapshot();
		const counts = `${plural(snap.changed, "path")} changed and ${plural(snap.deleted, "path")} deleted against the workspace, ${snap.bytes} bytes`;
		ui.notify(`Sandbox: snapshot ${snap.id} (${counts}); /sandbox restore ${snap.id} returns to it`, "info");
		return "taken";
	} catch (error) {
		// INVALID_ARGUMENT: an `rw` session (or a backend without snapshots); CONFLICT: a call in flight, a cap.
		const refused = refusal(error);
		ui.notify(`Sandbox: no snapshot was taken: ${(error as Error).message}`, refused ? "warning" : "error");
		return refused ? "refused" : "failed";
	}
}

/**
 * `/sandbox restore ID [--force]`: the session back at snapshot ID (a confirm in `ask`, answered by
 * `approver`). A path the host changed since is a CONFLICT naming it; `--force` restores all the same.
 */
export async function restoreCommand(
	session: SandboxSession | undefined,
	words: readonly string[],
	ui: Notify,
	options: { approver?: Approver; turnId?: string } = {},
): Promise<SnapshotOutcome> {
	const force = words.includes("--force");
	const ids = words.filter((word) => word !== "--force");
	if (ids.length !== 1 || ids[0]?.startsWith("-")) {
		ui.notify("Sandbox: /sandbox restore ID [--force] takes one snapshot id (from /sandbox snapshot or /sandbox fork)", "warning");
		return "usage";
	}
	const id = ids[0] as string;
	if (!running(session, ui)) return "not-running";
	try {
		const restored = await session.restore(id, { force, approver: options.approver, turnId: options.turnId });
		const { mode, operating_mode: operating } = session.info;
		const lines = [
			`Sandbox: restored snapshot ${restored.snapshot_id} in ${Math.round(restored.took_ms)} ms: the session's view is back to it (${plural(restored.changed, "path")} apart from the workspace), in a new jail; permission mode ${mode}, operating mode ${operating ?? "agent"}`,
		];
		if (restored.host_changed.length > 0) {
			lines.push(`The host changed ${paths(restored.host_changed)} since; an apply of this session's changes refuses them.`);
		}
		ui.notify(lines.join("\n"), restored.host_changed.length > 0 ? "warning" : "info");
		return "restored";
	} catch (error) {
		const code = error instanceof SandboxError ? error.code : undefined;
		const message = error instanceof Error ? error.message : String(error);
		const changed = conflictPaths(error);
		if (code === "CONFLICT" && changed.length > 0) {
			ui.notify(
				`Sandbox: snapshot ${id} was not restored: the host changed ${paths(changed)} since it was taken, and restoring would hide that.\n` +
					`/sandbox restore ${id} --force restores it all the same (an apply of this session's changes then refuses those paths).`,
				"warning",
			);
			return "conflict";
		}
		if (code === "CONFLICT") {
			ui.notify(`Sandbox: snapshot ${id} was not restored: ${message}`, "warning");
			return "conflict";
		}
		if (code === "TOOL_DENIED") {
			ui.notify(`Sandbox: snapshot ${id} was not restored: ${message}`, "warning");
			return "denied";
		}
		if (code === "INVALID_ARGUMENT") {
			ui.notify(`Sandbox: cannot restore ${id}: ${message}`, "warning");
			return "refused";
		}
		ui.notify(`Sandbox: restore of ${id} failed: ${message}`, "error");
		return "failed";
	}
}

/**
 * `/sandbox fork N`: N sessions from this one's state now. pi cannot switch to them, so this says
 * which they are and names their snapshot, which `/sandbox restore` returns this session to.
 */
export async function forkCommand(
	session: SandboxSession | undefined,
	words: readonly string[],
	ui: Notify,
	options: { turnId?: string } = {},
): Promise<SnapshotOutcome> {
	const n = words.length === 0 ? 1 : words.length === 1 && /^\d+$/.test(words[0] as string) ? Number(words[0]) : Number.NaN;
	if (!(n >= 1 && n <= 16)) {
		ui.notify("Sandbox: /sandbox fork takes a number of sessions, 1 to 16 (default 1)", "warning");
		return "usage";
	}
	if (!running(session, ui)) return "not-running";
	try {
		const forked = await session.fork(n, options);
		const ids = forked.sessions.map((s) => s.session_id);
		ui.notify(
			[
				`Sandbox: forked session ${forked.session_id} into ${plural(ids.length, "session")} from snapshot ${forked.snapshot_id}: ${ids.join(", ")}`,
				"Each fork is a sandbox session of its own on this server, with its own jail and changeset; pi drives one sandbox session and cannot switch to them. " +
					"They close when this sandbox server stops (pi exits, /sandbox restart, /sandbox profile), their changes then kept for review like this session's.",
				`This session goes on unchanged; /sandbox restore ${forked.snapshot_id} returns it to this point later.`,
			].join("\n"),
			"info",
		);
		return "forked";
	} catch (error) {
		const refused = refusal(error);
		ui.notify(`Sandbox: no fork was made: ${(error as Error).message}`, refused ? "warning" : "error");
		return refused ? "refused" : "failed";
	}
}
