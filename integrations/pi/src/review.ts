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

/**
 * A name or a line a jail chose, made safe to show: the port of the server's `sandbox.textsafe.printable`
 * (issue 31, category 9). Every control, format (bidi overrides, zero-width), separator, surrogate,
 * private-use or unassigned character, and every space but U+0020, becomes a backslash escape
 * (`\n`, `\x1b`, `\u202e`), so a name cannot forge or hide a line of the review. The server escapes
 * the diff and the git lines already (this is a no-op on them); entry paths arrive raw, as data.
 */
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]|(?! )\p{Zs}/gu;
const NAMED: Record<string, string> = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };

export function printable(text: string, keep = ""): string {
	return text.replace(UNPRINTABLE, (char) => {
		if (keep.includes(char)) return char;
		if (NAMED[char]) return NAMED[char];
		const code = char.codePointAt(0) ?? 0;
		if (code < 0x100) return `\\x${code.toString(16).padStart(2, "0")}`;
		return code < 0x10000 ? `\\u${code.toString(16).padStart(4, "0")}` : `\\U${code.toString(16).padStart(8, "0")}`;
	});
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
	return `${entry.status.padEnd(8)} ${printable(entry.path)}${flags}`;
}

/** The review text: header, entries (a repository's .git data summed up), git summary, diff. */
export function reviewText(view: ChangesetView): string[] {
	const grouped = view.git_lines.length > 0;
	const entries = pendingEntries(view);
	const shown = entries.filter((entry) => !(grouped && entry.path.startsWith(".git/") && !entry.flags?.length));
	const lines = [`${view.id}: ${countsLine(view.counts)} (kept by a ${view.source}, profile ${view.profile}, ${view.backend})`];
	lines.push(...shown.map(entryLine));
	if (shown.length < entries.length) lines.push(`.git: ${entries.length - shown.length} more entries of the repository's data (the git group)`);
	if (view.untracked.length > 0) lines.push(`not tracked (bound read-only, never copied): ${printable(view.untracked.join(", "))}`);
	lines.push(...view.git_lines.map((line) => printable(line, "\t")), "");
	lines.push(...view.diff.split("\n").map((line) => printable(line, "\t")));
	return lines;
}

function heldLine(held: HeldBack): string {
	const flags = `[${held.flags.join(", ")}]`;
	const path = printable(held.path);
	return held.group ? `${path} (the git group, ${held.entries ?? "?"} entries) ${flags}` : `${path} ${flags}`;
}

/** One notice for an apply: what was applied, and each thing that was not with why. */
export function reportText(report: ApplyReport): string {
	const lines = [`Sandbox: applied ${report.applied.length} of ${report.id}'s entries to the workspace (${report.state}).`];
	for (const conflict of report.conflicts) lines.push(printable(`CONFLICT ${conflict.path}: ${conflict.reason}`));
	for (const held of report.held_back) lines.push(`held back ${heldLine(held)}`);
	for (const skipped of report.skipped) lines.push(printable(`skipped ${skipped.path}: ${skipped.reason}`));
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
