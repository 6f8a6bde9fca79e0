/**
 * Review records in pi. After a Write or Edit in the workspace the server returns a review
 * record (seed 003 §4c); pi tells the user what became of the file, its line counts and the
 * snapshot, and `/sandbox rollback [SNAPSHOT_ID]` puts the file back as it was before that tool
 * ran, through the server's hash-guarded `snapshot.rollback`: a file changed since is left alone.
 *
 * pi's edit reaches the server as a Write of the whole new content, so its records say `write`.
 */

import path from "node:path";
import type { ExtensionUIContext } from "@earendil-works/pi-coding-agent";
import { SandboxError } from "./errors.ts";
import { observeResults, type SandboxCallContext } from "./operations.ts";
import { parseReview, type ReviewChange } from "./protocol.ts";
import type { SandboxSession } from "./session.ts";

/** How many records are remembered (a rollback names one of them by default). */
const KEPT = 200;

interface Reviewed {
	sessionId: string;
	review: ReviewChange;
}

/** The review records of this pi process, newest last, each with the sandbox session it belongs to. */
export class ReviewLog {
	private readonly entries: Reviewed[] = [];

	note(sessionId: string, review: ReviewChange): void {
		this.entries.push({ sessionId, review });
		if (this.entries.length > KEPT) this.entries.shift();
	}

	/** The newest change of `sessionId` not rolled back yet: repeated rollbacks walk back through them. */
	last(sessionId: string): ReviewChange | undefined {
		return this.entries.findLast((e) => e.sessionId === sessionId && e.review.state === "active")?.review;
	}

	find(snapshotId: string): Reviewed | undefined {
		return this.entries.findLast((e) => e.review.snapshot_id === snapshotId);
	}

	markRolledBack(snapshotId: string): void {
		for (const entry of this.entries) {
			if (entry.review.snapshot_id === snapshotId) entry.review = { ...entry.review, state: "rolledBack" };
		}
	}
}

function lines(review: ReviewChange): string {
	if (review.additions !== null && review.deletions !== null) return `+${review.additions} -${review.deletions}`;
	return review.binary ? "binary" : "lines not counted (too large)";
}

/** `Sandbox: src/a.ts modified (+3 -1), snapshot 1f2e…; /sandbox rollback 1f2e… undoes it`. */
export function reviewNotice(review: ReviewChange, workspace: string): string {
	// The server names the path relative to the workspace (ADR 0043); an older one named it whole.
	const relative = path.isAbsolute(review.path) ? path.relative(workspace, review.path) : review.path;
	const shown = relative && !relative.startsWith("..") && !path.isAbsolute(relative) ? relative : review.path;
	const head = `Sandbox: ${shown} ${review.status} (${lines(review)}), snapshot ${review.snapshot_id}`;
	if (!review.reversible) {
		const why = review.status === "deleted" ? "a removed file cannot be restored yet" : "the previous content was too large to keep";
		return `${head}; cannot be rolled back (${why})`;
	}
	return `${head}; /sandbox rollback ${review.snapshot_id} undoes it`;
}

/**
 * `ctx` with every successful call's review record passed to `onReview`. The session is wrapped,
 * not changed: pi's write and edit operations call `session.call` and read `session.info` only.
 */
export function observeReviews(
	ctx: SandboxCallContext,
	onReview: (session: SandboxSession, review: ReviewChange) => void,
): SandboxCallContext {
	return observeResults(ctx, (session, result) => {
		const review = result.ok ? parseReview(result.review) : undefined;
		if (review) onReview(session, review);
	});
}

export type RollbackOutcome = "rolled-back" | "conflict" | "unknown" | "nothing" | "not-running" | "failed";

type Notify = Pick<ExtensionUIContext, "notify">;

/** `/sandbox rollback [SNAPSHOT_ID]`: the named change, else this session's newest one not rolled back. */
export async function rollbackCommand(session: SandboxSession | undefined, log: ReviewLog, arg: string, ui: Notify): Promise<RollbackOutcome> {
	if (!session?.alive) {
		ui.notify("Sandbox: not running; there is nothing to roll back (`/sandbox restart` starts a new session).", "warning");
		return "not-running";
	}
	const sessionId = session.info.session_id;
	const snapshotId = arg.trim() || log.last(sessionId)?.snapshot_id;
	if (!snapshotId) {
		ui.notify("Sandbox: no Write or Edit of this session is left to roll back.", "info");
		return "nothing";
	}
	const earlier = log.find(snapshotId);
	if (earlier && earlier.sessionId !== sessionId) {
		ui.notify(`Sandbox: snapshot ${snapshotId} belonged to an earlier sandbox session; its snapshots went with it.`, "warning");
		return "unknown";
	}
	return rollbackOne(session, log, snapshotId, ui);
}

async function rollbackOne(session: SandboxSession, log: ReviewLog, snapshotId: string, ui: Notify): Promise<RollbackOutcome> {
	try {
		const answer = await session.rollback(snapshotId);
		log.markRolledBack(snapshotId);
		ui.notify(`Sandbox: rolled back ${snapshotId}: ${answer.content}`, "info");
		return "rolled-back";
	} catch (error) {
		const code = error instanceof SandboxError ? error.code : undefined;
		const message = error instanceof Error ? error.message : String(error);
		if (code === "CONFLICT") {
			ui.notify(`Sandbox: rollback of ${snapshotId} refused: ${message}`, "warning");
			return "conflict";
		}
		if (code === "INVALID_ARGUMENT") {
			ui.notify(`Sandbox: no snapshot ${snapshotId} in this session (${message})`, "warning");
			return "unknown";
		}
		ui.notify(`Sandbox: rollback of ${snapshotId} failed: ${message}`, "error");
		return "failed";
	}
}
