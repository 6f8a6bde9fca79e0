/**
 * Review, then apply: what a copy/overlay session changed reaches the workspace only when the
 * user says so. The server keeps the changes under an id at `session.close`, never discarding
 * them; this module shows a kept changeset in pi's UI (the entries, the git summary, the diff)
 * and applies, holds back or discards it as the user chooses. Without a UI nothing is decided:
 * the changeset stays kept and its id is printed.
 */

import type { ExtensionUIContext } from "@earendil-works/pi-coding-agent";
import { SandboxError } from "./errors.ts";
import type { ApplyReport, ChangeCounts, ChangeEntry, ChangesetView, HeldBack } from "./protocol.ts";
import type { SandboxSession } from "./session.ts";

export interface ReviewContext {
	hasUI: boolean;
	ui: Pick<ExtensionUIContext, "select" | "notify" | "setWidget" | "editor">;
}

export type ReviewOutcome = "applied" | "partial" | "kept" | "discarded" | "empty" | "failed";

const WIDGET = "sandbox-review";
/** The widget above pi's editor shows this many lines; the rest is one choice away. */
const WIDGET_LINES = 120;

const SHOW_ALL = "Show the whole diff";
const KEEP = "Keep for later";
const DISCARD = "Discard";

/** `2 added, 1 modified, 1 flagged`; `no changes` when there are none. */
export function countsLine(counts: ChangeCounts | null | undefined): string {
	if (!counts) return "no changes";
	const parts = (["added", "modified", "deleted", "flagged"] as const).filter((key) => counts[key] > 0).map((key) => `${counts[key]} ${key}`);
	return parts.length > 0 ? parts.join(", ") : "no changes";
}

/** What is said where no dialog can be shown (print mode, RPC without UI, pi quitting). */
export function keptMessage(id: string, counts: ChangeCounts | null | undefined): string {
	return (
		`sandbox: this session's changes are kept as ${id} (${countsLine(counts)}); nothing was applied to the workspace.\n` +
		`  review: sandbox changes show ${id}\n  apply:  sandbox changes apply ${id}   (or /sandbox review in pi)\n`
	);
}

function pendingEntries(view: ChangesetView): ChangeEntry[] {
	return view.changes.filter((entry) => !entry.applied && entry.applicable !== false);
}

function entryLine(entry: ChangeEntry): string {
	const flags = entry.flags?.length ? `  [${entry.flags.join(", ")}]` : "";
	return `${entry.status.padEnd(8)} ${entry.path}${flags}`;
}

/** The review text: header, entries (a repository's .git data summed up), git summary, diff. */
export function reviewText(view: ChangesetView): string[] {
	const grouped = view.git_lines.length > 0;
	const entries = pendingEntries(view);
	const shown = entries.filter((entry) => !(grouped && entry.path.startsWith(".git/") && !entry.flags?.length));
	const lines = [`${view.id}: ${countsLine(view.counts)} (kept by a ${view.source}, profile ${view.profile}, ${view.backend})`];
	lines.push(...shown.map(entryLine));
	if (shown.length < entries.length) lines.push(`.git: ${entries.length - shown.length} more entries of the repository's data (the git group)`);
	if (view.untracked.length > 0) lines.push(`not tracked (bound read-only, never copied): ${view.untracked.join(", ")}`);
	lines.push(...view.git_lines, "");
	lines.push(...view.diff.split("\n"));
	return lines;
}

function heldLine(held: HeldBack): string {
	const flags = `[${held.flags.join(", ")}]`;
	return held.group ? `${held.path} (the git group, ${held.entries ?? "?"} entries) ${flags}` : `${held.path} ${flags}`;
}

/** One notice for an apply: what was applied, and each thing that was not with why. */
export function reportText(report: ApplyReport): string {
	const lines = [`Sandbox: applied ${report.applied.length} of ${report.id}'s entries to the workspace (${report.state}).`];
	for (const conflict of report.conflicts) lines.push(`CONFLICT ${conflict.path}: ${conflict.reason}`);
	for (const held of report.held_back) lines.push(`held back ${heldLine(held)}`);
	for (const skipped of report.skipped) lines.push(`skipped ${skipped.path}: ${skipped.reason}`);
	if (report.held_back.length > 0) lines.push(`Flagged entries wait for consent: /sandbox review, or sandbox changes apply ${report.id} --include-flagged`);
	return lines.join("\n");
}

/**
 * Show a kept changeset and do what the user picks: apply it (flagged entries included only when
 * chosen), apply only its unflagged entries, keep it for later, or discard it. Dismissing the
 * dialog keeps it. Without a UI the changeset is kept and nothing is asked.
 */
export async function reviewChangeset(session: SandboxSession, id: string, ctx: ReviewContext): Promise<ReviewOutcome> {
	const view = await session.showChanges(id);
	const pending = pendingEntries(view);
	if (pending.length === 0) {
		if (ctx.hasUI) ctx.ui.notify(`Sandbox: ${id} has nothing left to apply (${view.state}).`, "info");
		return "empty";
	}
	if (!ctx.hasUI) return "kept";
	const flagged = pending.filter((entry) => entry.flags?.length).length;
	const applyAll = flagged > 0 ? `Apply all ${pending.length}, the ${flagged} flagged included` : `Apply ${pending.length}`;
	const applyUnflagged = `Apply the ${pending.length - flagged} unflagged, hold back the ${flagged} flagged`;
	const text = reviewText(view);
	const more = text.length - WIDGET_LINES;
	ctx.ui.setWidget(WIDGET, more > 0 ? [...text.slice(0, WIDGET_LINES), `… ${more} more lines: "${SHOW_ALL}"`] : text);
	try {
		const options = [applyAll, ...(flagged > 0 ? [applyUnflagged] : []), ...(more > 0 ? [SHOW_ALL] : []), KEEP, DISCARD];
		for (;;) {
			const choice = await ctx.ui.select(`Sandbox: apply the changes kept as ${id} (${countsLine(view.counts)}) to the workspace?`, options);
			if (choice === SHOW_ALL) {
				await ctx.ui.editor(`${id} (a view: what you type here changes nothing)`, text.join("\n"));
				continue;
			}
			if (choice === applyAll || choice === applyUnflagged) return await apply(session, id, ctx, choice === applyAll);
			if (choice === DISCARD) {
				await session.discardChanges(id);
				ctx.ui.notify(`Sandbox: discarded ${id}; the workspace is unchanged.`, "info");
				return "discarded";
			}
			ctx.ui.notify(`Sandbox: kept ${id}. /sandbox review, or sandbox changes apply ${id}, applies it later.`, "info");
			return "kept";
		}
	} finally {
		ctx.ui.setWidget(WIDGET, undefined);
	}
}

async function apply(session: SandboxSession, id: string, ctx: ReviewContext, includeFlagged: boolean): Promise<ReviewOutcome> {
	try {
		const report = await session.applyChanges(id, { includeFlagged });
		const whole = report.conflicts.length === 0 && report.skipped.length === 0 && report.held_back.length === 0;
		ctx.ui.notify(reportText(report), whole ? "info" : "warning");
		return whole ? "applied" : "partial";
	} catch (error) {
		// CONFLICT (the kept content changed, another apply holds it): nothing was applied.
		const reason = error instanceof SandboxError ? `${error.code}: ${error.message}` : (error as Error).message;
		ctx.ui.notify(`Sandbox: ${id} was not applied; it stays kept.\n${reason}`, "error");
		return "failed";
	}
}
