/** Approval requests reach the approver; deny blocks, allow lets the call through. */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { createBashTool, createWriteTool } from "@earendil-works/pi-coding-agent";
import { createUiApprover } from "../src/index.ts";
import { createSandboxBashOperations, createSandboxWriteOperations } from "../src/operations.ts";
import type { ApprovalDecision, ApprovalRequest } from "../src/protocol.ts";
import { openSandbox, text } from "./helpers.ts";

function recorder(decision: ApprovalDecision) {
	const seen: ApprovalRequest[] = [];
	return { seen, approver: (request: ApprovalRequest) => (seen.push(request), decision) };
}

function fakeUi(answer: string | undefined, hasUI = true) {
	const asked: Array<{ title: string; options: string[] }> = [];
	return {
		asked,
		ctx: {
			hasUI,
			ui: {
				select: async (title: string, options: string[]) => (asked.push({ title, options }), answer),
			} as never,
		},
	};
}

describe("approvals (mode ask)", () => {
	it("a deny blocks the write; the request names the tool and the path", async () => {
		const sb = await openSandbox({ mode: "ask" });
		const { seen, approver } = recorder("deny");
		const write = createWriteTool(sb.workspace, { operations: createSandboxWriteOperations(sb.ctx(approver)) });
		const error = await write.execute("a1", { path: "denied.txt", content: "x" }).then(
			() => assert.fail("the write went through"),
			(e: Error) => e,
		);
		assert.match(error.message, /TOOL_DENIED/);
		assert.equal(existsSync(path.join(sb.workspace, "denied.txt")), false);
		assert.equal(seen.length, 1);
		assert.equal(seen[0]?.tool, "Write");
		assert.equal(seen[0]?.resource, path.join(sb.workspace, "denied.txt"));
		await sb.close();
	});

	it("allow-once lets the write through", async () => {
		const sb = await openSandbox({ mode: "ask" });
		const { seen, approver } = recorder("allow-once");
		const write = createWriteTool(sb.workspace, { operations: createSandboxWriteOperations(sb.ctx(approver)) });
		await write.execute("a2", { path: "allowed.txt", content: "ok\n" });
		assert.equal(readFileSync(path.join(sb.workspace, "allowed.txt"), "utf8"), "ok\n");
		assert.equal(seen.length, 1);
		await sb.close();
	});

	it("pi's UI: the select dialog decides; no UI (print mode) denies without asking", async () => {
		const sb = await openSandbox({ mode: "ask" });
		const allow = fakeUi("Allow once");
		const write = createWriteTool(sb.workspace, { operations: createSandboxWriteOperations(sb.ctx(createUiApprover(allow.ctx))) });
		await write.execute("a3", { path: "via-ui.txt", content: "ui\n" });
		assert.equal(readFileSync(path.join(sb.workspace, "via-ui.txt"), "utf8"), "ui\n");
		assert.equal(allow.asked.length, 1);
		assert.match(allow.asked[0]?.title ?? "", /Sandbox: allow Write to write .*via-ui\.txt/);
		assert.deepEqual(allow.asked[0]?.options, ["Allow once", "Allow for this session", "Deny"]);

		const dismissed = fakeUi(undefined);
		const write2 = createWriteTool(sb.workspace, { operations: createSandboxWriteOperations(sb.ctx(createUiApprover(dismissed.ctx))) });
		await write2.execute("a4", { path: "dismissed.txt", content: "x" }).catch(() => undefined);
		assert.equal(existsSync(path.join(sb.workspace, "dismissed.txt")), false, "a dismissed dialog denies");

		const headless = fakeUi("Allow once", false);
		const write3 = createWriteTool(sb.workspace, { operations: createSandboxWriteOperations(sb.ctx(createUiApprover(headless.ctx))) });
		const refused = await write3.execute("a5", { path: "headless.txt", content: "x" }).then(
			(r) => assert.fail(`wrote: ${text(r)}`),
			(e: Error) => e,
		);
		assert.equal(existsSync(path.join(sb.workspace, "headless.txt")), false);
		assert.equal(headless.asked.length, 0);
		// Nobody was asked, and the refusal says so: not "the user denied permission".
		assert.match(refused.message, /no one could be asked: the call was refused \(fail closed\)/);
		assert.doesNotMatch(refused.message, /user denied/);
		const { records } = await sb.session.client.request<{ records: Array<Record<string, unknown>> }>("audit.query", {
			session_id: sb.session.info.session_id,
		});
		const row = records.find((r) => String(r.tool_call_id).startsWith("test:") && String(r.args_preview).includes("headless.txt"));
		assert.ok(row, JSON.stringify(records));
		assert.deepEqual([row.decided_by, row.prompted], ["unattended", false]);
		await sb.close();
	});

	it("a risky bash command asks too, and a deny means it never runs", async () => {
		const sb = await openSandbox({ mode: "ask" });
		const { seen, approver } = recorder("deny");
		const bash = createBashTool(sb.workspace, { operations: createSandboxBashOperations(sb.ctx(approver)) });
		const error = await bash.execute("a6", { command: `rm -rf /tmp/whatever; touch ${sb.workspace}/ran` }).then(
			(r) => assert.fail(`ran: ${text(r)}`),
			(e: Error) => e,
		);
		assert.match(error.message, /TOOL_DENIED/);
		assert.equal(seen[0]?.tool, "Bash");
		assert.equal(existsSync(path.join(sb.workspace, "ran")), false);
		await sb.close();
	});
});
