/**
 * The end of a repair loop (seed 003 §4d) for the model's edits in pi.
 *
 * pi's own `edit` matches `oldText` in pi's process (it reads and writes the file through the
 * sandbox), so a mismatch never reaches the server: the count is kept here, per turn and per path,
 * as the server keeps it for its own Edit tool. The first failure says to Read the file again and
 * regenerate the change; the second in a turn says to stop and ends pi's loop after the batch
 * (`terminate`, pi-agent-core's early-termination hint). A failed patch command (`git apply`,
 * `patch`, `apply_patch`) is counted by the server, whose Bash result carries `terminate`.
 */
import { SandboxError } from "./errors.ts";
import type { ToolResult } from "./protocol.ts";

export const MUTATION_ATTEMPTS = 2;

export interface Failure {
	mutationFailureKind: "edit" | "patch";
	mutationFailureAttempt: number;
	terminate: boolean;
	note: string;
}

export class RepairGuard {
	private readonly turns = new Map<string, Map<string, number>>();

	/** Count a failed edit of `path` in `turnId`; what the model is told and whether the loop ends. */
	editFailed(turnId: string, path: string): Failure {
		const counts = this.turns.get(turnId) ?? new Map<string, number>();
		this.turns.set(turnId, counts);
		if (this.turns.size > 64) this.turns.delete(this.turns.keys().next().value as string);
		const attempt = (counts.get(path) ?? 0) + 1;
		counts.set(path, attempt);
		const terminate = attempt >= MUTATION_ATTEMPTS;
		const note = terminate
			? `[stop: the edit of ${path} failed again in this turn (failure ${attempt}). Do not retry it, nor hand-edit the change: ` +
				"Read the file again before any other change, or stop and ask the user, saying exactly what did not match]"
			: `[a failed edit of ${path}: Read the file once more and regenerate the change; a second failure in this turn stops the attempt]`;
		return { mutationFailureKind: "edit", mutationFailureAttempt: attempt, terminate, note };
	}
}

/** Whether an edit's failure is the model's (a mismatch), not the sandbox refusing or going away. */
export function isEditMismatch(error: unknown): boolean {
	for (let e: unknown = error; e instanceof Error; e = e.cause) {
		if (e instanceof SandboxError) return false;
	}
	return error instanceof Error;
}

/** The server's loop-guard verdict on a Bash call (a failed patch command), if it ended the loop. */
export function serverStop(result: ToolResult | undefined): string | undefined {
	if (result?.details.terminate !== true) return undefined;
	return result.content.split("\n").findLast((line) => line.startsWith("[stop:"));
}
