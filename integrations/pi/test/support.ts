/**
 * The extension as pi loads it, shared by the tests that drive it: its default export called with a
 * stand-in ExtensionAPI that records what it registers, a stand-in ExtensionContext whose UI answers
 * from a script, and the workspace and data directory a describe block's sessions share.
 */
import { rmSync } from "node:fs";
import { after, before } from "node:test";
import type { AgentToolResult, ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";
import sandboxExtension from "../src/index.ts";
import { tempDir } from "./helpers.ts";

export interface RegisteredTool {
	name: string;
	execute: (id: string, params: unknown, signal: AbortSignal | undefined, onUpdate: undefined, ctx: unknown) => Promise<AgentToolResult<unknown>>;
}
type Handler = (event: unknown, ctx: unknown) => unknown;
interface Command {
	handler: (args: string, ctx: unknown) => Promise<void>;
}

/**
 * The extension over a stand-in pi whose flags are `flags`; `more` adds what a test's pi offers
 * beyond registering (getAllTools, say), given the tools registered so far. `emit` runs an event's
 * handlers in order and returns the last one's answer.
 */
export function loadExtension(flags: Record<string, string> = {}, more: (tools: Map<string, RegisteredTool>) => object = () => ({})) {
	const tools = new Map<string, RegisteredTool>();
	const handlers = new Map<string, Handler[]>();
	const commands = new Map<string, Command>();
	const pi = {
		registerFlag: () => {},
		getFlag: (name: string) => flags[name],
		registerTool: (tool: RegisteredTool) => tools.set(tool.name, tool),
		on: (event: string, handler: Handler) => handlers.set(event, [...(handlers.get(event) ?? []), handler]),
		registerCommand: (name: string, options: Command) => commands.set(name, options),
		...more(tools),
	};
	sandboxExtension(pi as unknown as ExtensionAPI);
	const emit = async (event: string, payload: unknown, ctx: unknown) => {
		let last: unknown;
		for (const handler of handlers.get(event) ?? []) last = await handler(payload, ctx);
		return last;
	};
	return { tools, commands, emit };
}

/** How the stand-in UI answers a select: the option it picks, or undefined for a dismissed question. */
export type Select = (title: string, options: string[]) => string | undefined;

/**
 * A stand-in ExtensionContext on `cwd`: every select is recorded in `asked` and answered by `select`,
 * every notice kept in `notes`. `widgets` adds the UI calls of `/sandbox review` (setWidget, editor).
 */
export function standInContext(cwd: string, select: Select, options: { hasUI?: boolean; widgets?: boolean } = {}) {
	const hasUI = options.hasUI ?? true;
	const notes: string[] = [];
	const asked: string[] = [];
	const widgets = options.widgets ? { setWidget: () => {}, editor: async () => undefined } : {};
	const ctx = {
		cwd,
		hasUI,
		mode: hasUI ? "tui" : "print",
		signal: undefined,
		ui: {
			select: async (title: string, choices: string[]) => (asked.push(title), select(title, choices)),
			notify: (message: string) => notes.push(message),
			setStatus: () => {},
			...widgets,
		},
	};
	return { ctx: ctx as unknown as ExtensionContext, notes, asked };
}

/** A UI that gives every question the same `answer`. */
export function answering(cwd: string, answer: string | undefined = "Deny", hasUI = true) {
	return standInContext(cwd, () => answer, { hasUI });
}

/** A UI that gives `answers` in turn, then "Deny". */
export function answeringInTurn(cwd: string, answers: string[]) {
	return standInContext(cwd, () => answers.shift() ?? "Deny");
}

/** A UI that answers each select with the first option matching the next pattern; none left, it dismisses. */
export function scriptedUi(cwd: string, patterns: RegExp[]) {
	const pick: Select = (_title, choices) => {
		const want = patterns.shift();
		return want ? choices.find((choice) => want.test(choice)) : undefined;
	};
	return standInContext(cwd, pick, { widgets: true });
}

export interface SessionDirs {
	workspace: string;
	dataDir: string;
}

/**
 * A workspace and a data directory (`pi-sbx-<name>-ws-`, `-data-`) made before the enclosing describe
 * block's tests, SANDBOX_DATA_DIR naming it, and removed after them. Read the fields inside tests.
 */
export function sessionDirs(name: string): SessionDirs {
	const dirs: SessionDirs = { workspace: "", dataDir: "" };
	before(() => {
		dirs.workspace = tempDir(`pi-sbx-${name}-ws-`);
		dirs.dataDir = tempDir(`pi-sbx-${name}-data-`);
		process.env.SANDBOX_DATA_DIR = dirs.dataDir;
	});
	after(() => {
		for (const dir of [dirs.workspace, dirs.dataDir]) rmSync(dir, { recursive: true, force: true });
	});
	return dirs;
}
