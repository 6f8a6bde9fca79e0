/**
 * Review output is data (issue 31, category 9): pi's `printable` escapes what the server's
 * `sandbox.textsafe.printable` escapes (the same cases as tests/unit/test_changeset_fuzz.py), and
 * the review text shows one line per entry whatever a jail named its files.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { ChangesetView } from "../src/protocol.ts";
import { printable, reviewText } from "../src/review.ts";

const CASES: [string, string][] = [
	["a\nM  fake.py", "a\\nM  fake.py"],
	["\x1b[2Jcleared", "\\x1b[2Jcleared"],
	["x\u202etxt.exe", "x\\u202etxt.exe"],
	["tab\there\r", "tab\\there\\r"],
	["zero\u200bwidth\u2028line", "zero\\u200bwidth\\u2028line"],
	["\x7f\x85\udc80", "\\x7f\\x85\\udc80"],
	["plain/é ok", "plain/é ok"],
];

describe("printable", () => {
	for (const [raw, shown] of CASES) {
		it(`escapes ${JSON.stringify(raw)}`, () => assert.equal(printable(raw), shown));
	}

	it("keeps the review to one line per entry", () => {
		const view = {
			id: "ch-000000000000",
			counts: { added: 3, modified: 0, deleted: 0, flagged: 0, applied: 0 },
			source: "session",
			profile: "default",
			backend: "bwrap",
			untracked: [],
			git_lines: [],
			diff: "",
			changes: CASES.slice(0, 3).map(([path]) => ({ path, status: "added", kind: "file" })),
		} as unknown as ChangesetView;
		const lines = reviewText(view);
		assert.ok(!lines.some((line) => line.startsWith("M  fake.py")));
		assert.ok(!lines.join("\n").includes("\x1b") && !lines.join("\n").includes("\u202e"));
		assert.equal(lines.filter((line) => line.startsWith("added ")).length, 3);
	});
});
