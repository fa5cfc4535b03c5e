// assistd for VS Code: starts `assistd lsp` over stdio (or connects to an
// `assistd lsp --tcp` server) and lets vscode-languageclient (10+, where
// textDocument/inlineCompletion is a built-in feature) turn its answers into
// inline suggestions (ghost text).
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
  StreamInfo,
} from 'vscode-languageclient/node';

// The keys the server reads under `assistd` (initializationOptions and
// workspace/didChangeConfiguration). serverPath, serverArgs, serverAddress and
// tokenFile stay here: the server warns about keys it does not know. `enabled`
// stays here too: it can be set per language ("[python]": {...}), which the
// server cannot see, so the extension asks for nothing where it is off.
const SERVER_KEYS = [
  'model', 'backend', 'proposer', 'k', 'maxTokens', 'maxPromptTokens',
  'maxSuffixChars', 'maxLatencyMs', 'nCtx', 'fim', 'db', 'telemetry', 'crossFileTokens',
  'numerics',
] as const;

// The command the server puts on each inline item; VS Code runs it (through the
// client, as workspace/executeCommand) when the user accepts the suggestion.
const ACCEPTED = 'assistd.accepted';
const STATS_URI = vscode.Uri.parse('assistd-stats:/assistd%20stats.json');

let client: LanguageClient | undefined;
let statusItem: vscode.StatusBarItem;
// What the server last said (assistd/status), or the client's own view of it.
let serverState: { state: string; message: string } = { state: 'loading', message: 'starting' };
let statsText = '{}\n';
const statsChanged = new vscode.EventEmitter<vscode.Uri>();

function config(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration('assistd');
}

// Every key, as set or else its package.json default (the server's default).
// All of them, because the server applies a change over its current settings:
// a setting the user removes has to come back as its default.
function serverSettings(): Record<string, unknown> {
  const cfg = config();
  const settings: Record<string, unknown> = {};
  for (const key of SERVER_KEYS) {
    let value = cfg.get(key);
    if (key === 'k' && typeof value === 'string' && /^\d+$/.test(value)) {
      value = Number(value); // "8" typed in the Settings UI means 8
    }
    settings[key] = value;
  }
  return settings;
}

// ---------------------------------------------------------------------------
// User acceptance events (Copilot style notifications).
//
// VS Code's stable API has no "shown", "dismissed" or "partially accepted"
// hook for inline completions (handleDidShowCompletionItem and
// handleDidPartiallyAcceptCompletionItem are proposed API, closed to
// published extensions). So:
//   accepted  - VS Code runs the item's `assistd.accepted` command itself;
//               nothing to send here. Partial accepts (word by word) run no
//               command and are not reported.
//   shown     - the first item of a response VS Code did not cancel: the one
//               it presents first. (VS Code may still hide it when it no
//               longer matches the text.)
//   dismissed - a shown suggestion not accepted when a later response
//               replaces it with another one or none, or when the user
//               switches editor.
// ---------------------------------------------------------------------------

let shownId: string | undefined;

function suggestionId(item: vscode.InlineCompletionItem | undefined): string | undefined {
  const command = item?.command;
  const arg: unknown = command?.arguments?.[0];
  if (command?.command !== ACCEPTED || typeof arg !== 'object' || arg === null) {
    return undefined;
  }
  const id = (arg as { id?: unknown }).id;
  return typeof id === 'string' ? id : undefined;
}

// Sent whatever assistd.telemetry says: the server stores them only when it is on,
// and uses a dismissal either way (not shown again at that place).
function notify(method: string, params: Record<string, unknown>): void {
  if (client?.isRunning()) {
    void client.sendNotification(method, params);
  }
}

// ---------------------------------------------------------------------------
// On/off (all languages, or one: `assistd.enabled` is language-overridable)
// and the status-bar item.
// ---------------------------------------------------------------------------

function enabledFor(document: vscode.TextDocument | undefined): boolean {
  const cfg = document ? vscode.workspace.getConfiguration('assistd', document) : config();
  return cfg.get<boolean>('enabled', true);
}

function updateStatus(): void {
  const document = vscode.window.activeTextEditor?.document;
  const { state, message } = serverState;
  const on = enabledFor(document);
  const [icon, what] = !on ? ['$(circle-slash) ', document ? `off for ${document.languageId}` : 'off']
    : state === 'loading' ? ['$(sync~spin) ', `loading${message ? `: ${message}` : ''}`]
      : state === 'error' ? ['$(error) ', `error: ${message}`]
        : state === 'stopped' ? ['$(error) ', 'the server is not running']
          : ['', 'ready'];
  statusItem.text = `${icon}assistd`;
  statusItem.tooltip = `assistd: ${what}. Click for options.`;
  statusItem.show();
}

async function toggle(languageId?: string): Promise<void> {
  if (languageId === undefined) {
    await config().update('enabled', !config().get<boolean>('enabled', true),
      vscode.ConfigurationTarget.Global);
    return;
  }
  const cfg = vscode.workspace.getConfiguration('assistd', { languageId });
  await cfg.update('enabled', !cfg.get<boolean>('enabled', true),
    vscode.ConfigurationTarget.Global, true);
}

async function menu(): Promise<void> {
  const language = vscode.window.activeTextEditor?.document.languageId;
  const on = config().get<boolean>('enabled', true);
  const items: (vscode.QuickPickItem & { run: () => Thenable<unknown> })[] = [
    { label: on ? 'Turn off suggestions' : 'Turn on suggestions', run: () => toggle() },
    ...(language ? [{
      label: `${enabledFor(vscode.window.activeTextEditor?.document) ? 'Turn off' : 'Turn on'} for ${language}`,
      run: () => toggle(language),
    }] : []),
    { label: 'Show stats', run: showStats },
    { label: 'Restart server', run: restart },
    { label: 'Show log', run: async () => client?.outputChannel.show() },
  ];
  const pick = await vscode.window.showQuickPick(items, { title: `assistd: ${statusItem.tooltip}` });
  await pick?.run();
}

// ---------------------------------------------------------------------------
// Partial accept: VS Code's own next-word / next-line commands, with the
// characters they inserted reported (assistd/didPartiallyAcceptCompletion,
// acceptedLength: characters accepted of that suggestion so far).
// ---------------------------------------------------------------------------

const partial = new Map<string, number>();

// Escape on a suggestion: VS Code hides it and tells no extension (its
// handleDidRejectCompletionItem hook is proposed API), so the key is ours too.
async function dismiss(): Promise<void> {
  setShown(undefined);
  await vscode.commands.executeCommand('editor.action.inlineSuggest.hide');
}

async function acceptPartially(builtin: string): Promise<void> {
  const id = shownId;
  const document = vscode.window.activeTextEditor?.document;
  let inserted = 0;
  const listener = vscode.workspace.onDidChangeTextDocument((event) => {
    if (event.document === document) {
      inserted += event.contentChanges.reduce((n, c) => n + c.text.length, 0);
    }
  });
  try {
    await vscode.commands.executeCommand(builtin);
  } finally {
    listener.dispose();
  }
  if (id !== undefined && inserted > 0) {
    const total = (partial.get(id) ?? 0) + inserted;
    partial.set(id, total);
    if (partial.size > 64) { // only the suggestion on screen matters
      partial.delete(partial.keys().next().value as string);
    }
    notify('assistd/didPartiallyAcceptCompletion', { id, acceptedLength: total });
  }
}

function setShown(id: string | undefined): void {
  if (id === shownId) {
    return;
  }
  if (shownId !== undefined && !partial.has(shownId)) { // partly accepted: not dismissed
    notify('assistd/didDismissCompletion', { id: shownId });
  }
  shownId = id;
  if (id !== undefined) {
    notify('assistd/didShowCompletion', { id });
  }
}

// The token `assistd lsp --tcp` wants (initializationOptions.token): the file
// assistd.tokenFile names, else the one assistd creates in its config
// directory (platformdirs' user config dir, as the server computes it).
function readToken(): string {
  const home = os.homedir();
  const configDir = process.platform === 'darwin'
    ? path.join(home, 'Library', 'Application Support', 'assistd')
    : process.platform === 'win32'
      ? path.join(process.env.LOCALAPPDATA ?? path.join(home, 'AppData', 'Local'), 'assistd')
      : path.join(process.env.XDG_CONFIG_HOME || path.join(home, '.config'), 'assistd');
  const setting = config().get<string | null>('tokenFile', null);
  const file = setting ? setting.replace(/^~(?=$|[\\/])/, home) : path.join(configDir, 'token');
  const token = fs.readFileSync(file, 'utf8').trim(); // a missing file fails start(), with its name
  if (!token) {
    throw new Error(`the token file ${file} is empty`);
  }
  return token;
}

// assistd.serverAddress "HOST:PORT" -> a connection to that server; "" -> spawn.
function tcpServer(address: string): ServerOptions {
  const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(address);
  if (!m) {
    throw new Error(`assistd.serverAddress ${JSON.stringify(address)} is not HOST:PORT`);
  }
  const [host, port] = [m[1], Number(m[2])];
  return () => new Promise<StreamInfo>((resolve, reject) => {
    const socket = net.connect({ host, port }, () => resolve({ reader: socket, writer: socket }));
    socket.once('error', reject);
  });
}

function createClient(): LanguageClient {
  const cfg = config();
  const address = cfg.get<string>('serverAddress', '').trim();
  const token = address ? readToken() : undefined;
  // No `transport` field: stdio is the default, and TransportKind.stdio would
  // append `--stdio` to the arguments; serverArgs stays as the user wrote it.
  const serverOptions: ServerOptions = address ? tcpServer(address) : {
    command: cfg.get<string>('serverPath', 'assistd'),
    args: cfg.get<string[]>('serverArgs', ['lsp']),
  };
  const clientOptions: LanguageClientOptions = {
    // Every language, in files and unsaved editors.
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    // A function, so that a restart picks up the current settings. The token
    // goes only here, never in didChangeConfiguration.
    initializationOptions: () => ({ assistd: serverSettings(), ...(token ? { token } : {}) }),
    middleware: {
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        if (!enabledFor(document)) {
          setShown(undefined);
          return null;
        }
        const result = await next(document, position, context, token);
        if (!token.isCancellationRequested) { // a cancelled answer is never shown
          const items = Array.isArray(result) ? result : result?.items ?? [];
          setShown(suggestionId(items[0]));
        }
        return result;
      },
      // The server also offers textDocument/completion for clients without
      // inline completion. VS Code has it, and asking for both would run the
      // model twice per keystroke; so the popup gets nothing from assistd.
      provideCompletionItem: () => undefined,
      executeCommand: (command, args, next) => {
        if (command === ACCEPTED) {
          shownId = undefined; // accepted, so not dismissed
        }
        return next(command, args);
      },
    },
  };
  const created = new LanguageClient('assistd', 'assistd', serverOptions, clientOptions);
  created.onNotification('assistd/status', (params: { state?: unknown; message?: unknown }) => {
    const was = serverState.state;
    serverState = { state: String(params.state ?? ''), message: String(params.message ?? '') };
    updateStatus();
    if (serverState.state === 'ready' && was !== 'ready') {
      // A key pressed before the server was up asked nothing (or got nothing):
      // VS Code asks again only at the next edit, so ask now for the editor in front.
      const editor = vscode.window.activeTextEditor;
      if (editor && enabledFor(editor.document)) {
        void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
      }
    }
  });
  created.onDidChangeState((event) => {
    if (event.newState === State.Stopped && client === created) {
      serverState = { state: 'stopped', message: '' };
      updateStatus();
    }
  });
  return created;
}

async function restart(): Promise<void> {
  const old = client;
  client = undefined;
  shownId = undefined;
  if (old?.isRunning()) { // stop() throws on a client that failed to start
    await old.stop();
  }
  // Recreated rather than client.restart(): serverPath, serverArgs,
  // serverAddress and tokenFile are read when the client is built.
  await start();
}

async function start(): Promise<void> {
  const address = config().get<string>('serverAddress', '').trim();
  serverState = { state: 'loading', message: 'starting the server' };
  updateStatus();
  try {
    client = createClient();
    await client.start();
  } catch (error) {
    serverState = { state: 'error', message: String(error) };
    updateStatus();
    // Keep the extension (and its commands) alive, so that fixing the setting
    // restarts the server.
    void vscode.window.showErrorMessage(address
      ? `assistd: could not connect to ${address} (${String(error)}). Start ` +
        '`assistd lsp --tcp` there, and check assistd.tokenFile; the "assistd" output has its log.'
      : `assistd: could not start "${config().get('serverPath')}" (${String(error)}). ` +
        'Set assistd.serverPath to the assistd program; the "assistd" output has its log.');
  }
}

async function showStats(): Promise<void> {
  if (!client?.isRunning()) {
    void vscode.window.showWarningMessage('assistd: the server is not running (see the "assistd" output).');
    return;
  }
  // Sent directly: the client already registers the VS Code command
  // `assistd.stats` for the server's executeCommandProvider, so this
  // extension's own command needs another name.
  const stats: unknown = await client.sendRequest(ExecuteCommandRequest.type, {
    command: 'assistd.stats',
    arguments: [],
  });
  // A read-only document of our own scheme: not an untitled editor that asks to be
  // saved, and not sent to the server as a buffer (the selector takes file/untitled).
  statsText = JSON.stringify(stats, null, 2) + '\n';
  statsChanged.fire(STATS_URI);
  const document = await vscode.workspace.openTextDocument(STATS_URI);
  await vscode.languages.setTextDocumentLanguage(document, 'json');
  await vscode.window.showTextDocument(document, { preview: true });
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  statusItem = vscode.window.createStatusBarItem('assistd.status', vscode.StatusBarAlignment.Right, 100);
  statusItem.name = 'assistd';
  statusItem.command = 'assistd.menu';
  updateStatus();
  context.subscriptions.push(
    statusItem,
    vscode.workspace.registerTextDocumentContentProvider('assistd-stats', {
      onDidChange: statsChanged.event,
      provideTextDocumentContent: () => statsText,
    }),
    vscode.commands.registerCommand('assistd.showStats', showStats),
    vscode.commands.registerCommand('assistd.restart', restart),
    vscode.commands.registerCommand('assistd.menu', menu),
    vscode.commands.registerCommand('assistd.toggle', () => toggle()),
    vscode.commands.registerCommand('assistd.toggleLanguage', () => {
      const language = vscode.window.activeTextEditor?.document.languageId;
      return language ? toggle(language) : toggle();
    }),
    vscode.commands.registerCommand('assistd.dismiss', dismiss),
    vscode.commands.registerCommand('assistd.acceptNextWord',
      () => acceptPartially('editor.action.inlineSuggest.acceptNextWord')),
    vscode.commands.registerCommand('assistd.acceptNextLine',
      () => acceptPartially('editor.action.inlineSuggest.acceptNextLine')),
    vscode.window.onDidChangeActiveTextEditor(() => {
      setShown(undefined);
      updateStatus();
    }),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (event.affectsConfiguration('assistd.enabled')) {
        updateStatus();
        if (!enabledFor(vscode.window.activeTextEditor?.document)) {
          // Off now: hide what is on screen (VS Code keeps a shown suggestion).
          await vscode.commands.executeCommand('editor.action.inlineSuggest.hide');
        }
      }
      if (['serverPath', 'serverArgs', 'serverAddress', 'tokenFile']
        .some((key) => event.affectsConfiguration(`assistd.${key}`))) {
        await restart();
      } else if (event.affectsConfiguration('assistd') && client?.isRunning()) {
        // Sent by hand rather than through `synchronize.configurationSection`,
        // which would also send serverPath and serverArgs.
        await client.sendNotification(DidChangeConfigurationNotification.type, {
          settings: { assistd: serverSettings() },
        });
      }
    }),
  );
  await start();
}

export async function deactivate(): Promise<void> {
  if (client?.isRunning()) {
    await client.stop();
  }
}
