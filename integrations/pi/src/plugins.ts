/**
 * Plugin tools through the sandbox (seed 003 §11) and other extensions' tools through its gate.
 *
 * 1. Plugin manifests (JSON, see the repository's docs/plugins.md) are found in
 *    `$SANDBOX_PLUGINS` (paths separated by `:`), `--sandbox-plugin`, `<project>/.pi/sandbox-plugins/`
 *    and `~/.pi/agent/sandbox-plugins/` (each `*.json` there, and each `<dir>/plugin.json`). They are
 *    declared when the session opens; each is registered only after the user's grant (the server's
 *    `plugin.register` asks through pi's dialog; no UI: not registered). A registered plugin's tools
 *    become pi tools named `plugin_<id>_<tool>` whose calls run the manifest's command in the jail.
 * 2. Every other tool that neither pi's core nor this extension provides (another extension's, an
 *    MCP server's) is put to the server's gate before pi runs it (`tool.check`: a medium-risk
 *    plugin-like tool, refused in plan and goal, asked unless the policy allows medium risk, always
 *    asked when the policy's `ask_tools` names it, audited). Refused or unanswerable: pi does not run
 *    it. Such a tool still runs in pi's own process, on the host: only a manifest's command runs in
 *    the jail.
 */

import { existsSync, readdirSync, statSync } from "node:fs";
import path from "node:path";
import type { AgentToolResult, ExtensionToolContext, ToolDefinition } from "@earendil-works/pi-coding-agent";
import type { TSchema } from "typebox";
import type { PluginInfo, PluginToolInfo, ToolResult } from "./protocol.ts";

/** The folders whose manifests are declared, in order: the user's, then the project's. */
export function pluginFolders(cwd: string, home: string): string[] {
	return [path.join(home, ".pi", "agent", "sandbox-plugins"), path.join(cwd, ".pi", "sandbox-plugins")];
}

/** Manifest files: the explicit ones (`$SANDBOX_PLUGINS`, the flag), then those the folders hold. */
export function discoverManifests(explicit: readonly string[], folders: readonly string[]): string[] {
	const found = explicit.filter(Boolean).map((p) => path.resolve(p));
	for (const folder of folders) {
		if (!existsSync(folder)) continue;
		for (const entry of readdirSync(folder).sort()) {
			const full = path.join(folder, entry);
			const nested = path.join(full, "plugin.json");
			if (entry.endsWith(".json") && statSync(full).isFile()) found.push(full);
			else if (statSync(full).isDirectory() && existsSync(nested)) found.push(nested);
		}
	}
	return [...new Set(found)];
}

/** `$SANDBOX_PLUGINS` and the flag's value: manifest paths separated by `:` (or `,`). */
export function explicitManifests(...values: (string | undefined)[]): string[] {
	return values.flatMap((v) => (v ?? "").split(/[:,]/)).map((p) => p.trim()).filter(Boolean);
}

/** What the model reads of a plugin tool's call: the server's content; a failure is pi's error result. */
export function pluginResult(result: ToolResult): AgentToolResult<Record<string, unknown>> & { isError?: boolean } {
	const text = result.ok ? result.content : `${result.error_code ?? "TOOL_FAILED"}: ${result.content}`;
	return { content: [{ type: "text", text }], details: result.details, ...(result.ok ? {} : { isError: true }) };
}

/** The pi tool of a registered plugin tool; `run` makes the server's `tool.call`. */
export function pluginToolDefinition(
	tool: PluginToolInfo,
	run: (params: Record<string, unknown>, signal: AbortSignal | undefined, toolCallId: string, ctx: ExtensionToolContext) => Promise<ToolResult>,
): ToolDefinition<TSchema, Record<string, unknown>, unknown> {
	const risk = tool.risk ? `, risk ${tool.risk}` : "";
	return {
		name: tool.name,
		label: tool.name,
		description: `${tool.description} (sandbox plugin ${tool.plugin ?? ""}${risk}; runs inside the sandbox)`,
		// A plugin's schema is JSON Schema, as TypeBox's are: pi validates the arguments against it.
		parameters: tool.parameters as unknown as TSchema,
		execute: async (toolCallId, params, signal, _onUpdate, ctx) => pluginResult(await run(params as Record<string, unknown>, signal, toolCallId, ctx)),
	};
}

/** pi's own tools (core, `builtin:<name>`) and this extension's are not checked; every other tool is. */
export function needsCheck(
	name: string,
	ours: ReadonlySet<string>,
	all: readonly { name: string; sourceInfo?: { source?: string; path?: string } }[] | undefined,
): boolean {
	if (ours.has(name)) return false;
	const info = all?.find((t) => t.name === name)?.sourceInfo;
	return !(info?.source === "builtin" && info.path === `builtin:${name}`);
}

export function registrationLine(plugin: PluginInfo): string {
	const tools = plugin.tools.map((t) => t.name).join(", ");
	return plugin.registered
		? `Sandbox: plugin ${plugin.id} registered: ${tools}`
		: `Sandbox: plugin ${plugin.id} not registered (${plugin.reason ?? "not granted"})`;
}
