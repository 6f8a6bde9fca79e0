/**
 * The scripted session the pi harness benchmark replays: a small project to work on and the model's
 * tool calls, one per turn, over pi's seven built-in tools (ls, read, write, edit, grep, find, bash
 * with small commands). Every call is meant to succeed in both runs, with and without the sandbox,
 * so that the two runs time the same work.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import type { Reply } from "../test/fake-model.ts";

export const TOOLS = ["ls", "read", "write", "edit", "grep", "find", "bash"] as const;
export type ToolName = (typeof TOOLS)[number];

export interface Call {
	name: ToolName;
	args: Record<string, unknown>;
}

const MODULES = 12;

function moduleText(index: number): string {
	const lines = [`// module ${index}`, `export const NAME_${index} = "mod${index}";`];
	for (let line = 0; line < 40; line++) {
		lines.push(line % 13 === index % 13 ? `// TODO(mod${index}): revisit line ${line}` : `export function f${index}_${line}(x: number): number { return x + ${line}; }`);
	}
	return `${lines.join("\n")}\n`;
}

/**
 * A fresh copy of the project the session works on, a git repository as an agent's usually is (and
 * so that pi's own find does not need fd >= 8.7's --no-require-git, which Debian 12's fd lacks).
 */
export function seedWorkspace(workspace: string): void {
	execFileSync("git", ["init", "-q", workspace]);
	mkdirSync(path.join(workspace, "src"), { recursive: true });
	mkdirSync(path.join(workspace, "docs"), { recursive: true });
	mkdirSync(path.join(workspace, "notes"), { recursive: true });
	for (let index = 0; index < MODULES; index++) writeFileSync(path.join(workspace, "src", `mod${String(index).padStart(2, "0")}.ts`), moduleText(index));
	writeFileSync(path.join(workspace, "README.md"), `# sample\n\nA small project for the pi harness benchmark.\n\n${"Some prose. ".repeat(40)}\n`);
	writeFileSync(path.join(workspace, "docs", "guide.md"), `# guide\n\n${"- a point to remember\n".repeat(30)}`);
	writeFileSync(path.join(workspace, "docs", "api.md"), `# api\n\n${"`f(x)` returns x plus a constant.\n".repeat(30)}`);
	writeFileSync(path.join(workspace, "package.json"), `${JSON.stringify({ name: "sample", version: "1.0.0", type: "module" }, null, 2)}\n`);
}

const note = (index: number): string => `notes/note${index}.md`;

/** 44 calls, six or seven of each tool, in an order an agent might make them. */
export const CALLS: Call[] = [
	{ name: "ls", args: { path: "." } },
	{ name: "read", args: { path: "README.md" } },
	{ name: "find", args: { pattern: "*.ts" } },
	{ name: "grep", args: { pattern: "TODO", path: "src" } },
	{ name: "read", args: { path: "src/mod00.ts" } },
	{ name: "bash", args: { command: "wc -l src/*.ts | tail -n 1" } },
	{ name: "write", args: { path: note(1), content: "# plan\n\n- step one\n- step two\n" } },
	{ name: "ls", args: { path: "src" } },
	{ name: "read", args: { path: note(1) } },
	{ name: "edit", args: { path: note(1), edits: [{ oldText: "- step two", newText: "- step two, done" }] } },
	{ name: "grep", args: { pattern: "export const NAME_", path: "src", glob: "*.ts" } },
	{ name: "find", args: { pattern: "*.md", path: "docs" } },
	{ name: "bash", args: { command: "echo hello" } },
	{ name: "edit", args: { path: "src/mod01.ts", edits: [{ oldText: 'export const NAME_1 = "mod1";', newText: 'export const NAME_1 = "module one";' }] } },
	{ name: "read", args: { path: "src/mod01.ts", offset: 1, limit: 5 } },
	{ name: "write", args: { path: note(2), content: "second note\n".repeat(20) } },
	{ name: "ls", args: { path: "notes" } },
	{ name: "grep", args: { pattern: "module one", path: "." } },
	{ name: "bash", args: { command: "ls src | head -n 3" } },
	{ name: "find", args: { pattern: "mod1*.ts", path: "src" } },
	{ name: "write", args: { path: note(3), content: "third\n" } },
	{ name: "edit", args: { path: note(3), edits: [{ oldText: "third", newText: "third, edited" }] } },
	{ name: "read", args: { path: "docs/guide.md" } },
	{ name: "grep", args: { pattern: "f3_1\\d", path: "src/mod03.ts" } },
	{ name: "bash", args: { command: "cat package.json | wc -c" } },
	{ name: "ls", args: { path: "docs" } },
	{ name: "find", args: { pattern: "**/*.json" } },
	{ name: "write", args: { path: "src/extra.ts", content: "export const extra = 1;\n" } },
	{ name: "edit", args: { path: "src/extra.ts", edits: [{ oldText: "= 1;", newText: "= 2;" }] } },
	{ name: "read", args: { path: "src/extra.ts" } },
	{ name: "grep", args: { pattern: "extra", path: "src", ignoreCase: true } },
	{ name: "bash", args: { command: "true" } },
	{ name: "write", args: { path: note(4), content: "fourth\n" } },
	{ name: "ls", args: { path: "." } },
	{ name: "find", args: { pattern: "note*.md", path: "notes" } },
	{ name: "edit", args: { path: "docs/api.md", edits: [{ oldText: "# api", newText: "# API" }] } },
	{ name: "read", args: { path: "docs/api.md", limit: 10 } },
	{ name: "grep", args: { pattern: "API", path: "docs", literal: true } },
	{ name: "bash", args: { command: "grep -c TODO src/*.ts | head -n 4" } },
	{ name: "write", args: { path: note(5), content: "fifth\n" } },
	{ name: "edit", args: { path: note(5), edits: [{ oldText: "fifth", newText: "fifth, edited" }] } },
	{ name: "ls", args: { path: "notes" } },
	{ name: "find", args: { pattern: "*.ts", path: "src" } },
	{ name: "bash", args: { command: "echo done; date +%s >/dev/null" } },
];

/** The scripted model's replies: one tool call a turn, then a closing text. */
export function replies(): Reply[] {
	return [...CALLS.map((call): Reply => ({ toolCalls: [{ name: call.name, args: call.args }] })), { text: "done" }];
}
