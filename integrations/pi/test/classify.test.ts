/**
 * Seed 004's classifier answered by pi: with `policy.classifier = "auto"` the sandbox asks its
 * client (`classify.request`) about a call its rules leave open, and the extension judges it with
 * pi's own model API (here the scripted model on loopback): its allow runs the call, its block is
 * asked (headless: refused), and the audit records the judgement with the model's name.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { parseVerdict } from "../src/classify.ts";
import { FakeModel, piHome, piPrint, type Reply } from "./fake-model.ts";
import { SANDBOX_BIN, tempDir } from "./helpers.ts";

interface AuditRow {
	tool: string;
	resource: string;
	decision: string;
	decided_by: string;
	classifier_verdict: string | null;
	classifier_reason: string | null;
	classifier_model: string | null;
}

async function judged(verdict: Record<string, unknown>, prompt: string): Promise<{ model: FakeModel; rows: AuditRow[]; stdout: string }> {
	const replies: Reply[] = [{ toolCalls: [{ name: "bash", args: { command: "make --version" } }] }, { text: JSON.stringify(verdict) }, { text: "done" }];
	const model = await FakeModel.start(replies);
	const [home, workspace, dataDir] = [tempDir("pi-cls-home-"), tempDir("pi-cls-ws-"), tempDir("pi-cls-data-")];
	try {
		piHome(home, model);
		const profile = path.join(home, "classified.toml");
		writeFileSync(profile, '[policy]\nclassifier = "auto"\n');
		const env = { ...process.env, HOME: home, SANDBOX_BIN, SANDBOX_DATA_DIR: dataDir, SANDBOX_MODE: "ask", SANDBOX_PROFILE: profile };
		const run = await piPrint(workspace, env, prompt);
		const exported = execFileSync(SANDBOX_BIN, ["audit", "export", "--jsonl"], { env, encoding: "utf8" });
		const rows = exported
			.split("\n")
			.filter(Boolean)
			.map((line) => JSON.parse(line) as AuditRow);
		return { model, rows, stdout: run.stdout };
	} finally {
		await model.close();
		for (const dir of [home, workspace, dataDir]) rmSync(dir, { recursive: true, force: true });
	}
}

describe("the classifier through pi's model API", () => {
	it("pi's model allows: the call runs, judged and audited with the model's name and the user's message", async () => {
		const { model, rows } = await judged({ verdict: "allow", reason: "a harmless version check" }, "which make do we have?");
		const asked = model.requests[1] as { messages: Array<{ role: string; content: unknown }> };
		const system = JSON.stringify(asked.messages[0]);
		assert.match(system, /safety classifier/);
		const last = asked.messages.at(-1)?.content;
		const request = JSON.parse(typeof last === "string" ? last : ((last as Array<{ text: string }>)[0]?.text ?? ""));
		assert.equal(request.tool, "Bash");
		assert.equal(request.resource, "make --version");
		assert.equal(request.user_message, "which make do we have?");
		const bash = rows.find((row) => row.tool === "Bash");
		assert.ok(bash, JSON.stringify(rows));
		assert.equal(bash.decided_by, "classifier");
		assert.equal(bash.classifier_verdict, "allow");
		assert.equal(bash.classifier_model, "fake/scripted");
		assert.equal(bash.decision, "allow");
	});

	it("pi's model blocks: headless, nobody can be asked, so the call is refused", async () => {
		const { rows } = await judged({ verdict: "block", reason: "not today" }, "go");
		const bash = rows.find((row) => row.tool === "Bash");
		assert.ok(bash, JSON.stringify(rows));
		assert.equal(bash.classifier_verdict, "block");
		assert.equal(bash.classifier_reason, "not today");
		assert.equal(bash.decision, "deny");
	});

	it("a smuggled field fails the judgement: never allowed", async () => {
		const { rows } = await judged({ verdict: "allow", reason: "ok", grant: "allow-session" }, "go");
		const bash = rows.find((row) => row.tool === "Bash");
		assert.ok(bash, JSON.stringify(rows));
		assert.equal(bash.classifier_verdict, "failed");
		assert.equal(bash.decision, "deny");
	});

	it("parseVerdict takes a fenced object and refuses anything else", () => {
		assert.deepEqual(parseVerdict('```json\n{"verdict": "block", "reason": "no"}\n```'), { verdict: "block", reason: "no" });
		assert.throws(() => parseVerdict('{"verdict": "allow", "reason": "x", "level": "allow"}'), /other fields/);
		assert.throws(() => parseVerdict('{"verdict": "maybe", "reason": "x"}'), /neither/);
		assert.throws(() => parseVerdict("sure, go ahead"));
	});
});
