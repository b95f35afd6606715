// The watch page: lists the relay's broadcasts and plays each with moq-dev's <moq-watch>
// player. Query parameters:
//   name=BROADCAST  play only that broadcast (no listing), e.g. ?name=cam.hang
//   relay=URL       the relay to watch (default: this page's origin, which serves the page)
import "@moq/watch/element";

const params = new URLSearchParams(location.search);
const relay = relayUrl(params.get("relay"));
const only = params.get("name");
const list = document.getElementById("broadcasts");
const status = document.getElementById("status");

/** How often the listing asks the relay for its broadcasts again. */
const POLL_MS = 2000;

/** The relay URL the players dial: `relay` when given and valid, else this page's origin. */
function relayUrl(raw) {
	if (raw) {
		try {
			const url = new URL(raw, location.href);
			if (url.protocol === "http:" || url.protocol === "https:") return url;
		} catch {
			// Falls through to the page's origin; the status line names the bad value.
		}
		console.warn(`ignoring relay=${raw}: not an http(s) URL`);
	}
	return new URL("/", location.href);
}

/** Parses `/announced`: skiff-relay answers a JSON array, moq-relay one path per line. */
function parseAnnounced(text) {
	const trimmed = text.trim();
	if (trimmed.startsWith("[")) {
		const paths = JSON.parse(trimmed);
		if (!Array.isArray(paths)) throw new Error("/announced is not a JSON array");
		return paths.filter((p) => typeof p === "string" && p.length > 0);
	}
	return trimmed
		.split("\n")
		.map((p) => p.trim())
		.filter((p) => p.length > 0);
}

/** The players on the page, by broadcast name. */
const players = new Map();

/** Adds a player for `name`: `<moq-watch url name><canvas></canvas></moq-watch>`. */
function addPlayer(name) {
	const figure = document.createElement("figure");
	const caption = document.createElement("figcaption");
	const link = document.createElement("a");
	const direct = new URLSearchParams({ name });
	if (params.has("relay")) direct.set("relay", relay.href);
	link.href = `?${direct}`;
	link.textContent = name;
	caption.append(link);
	const watch = document.createElement("moq-watch");
	watch.setAttribute("url", relay.href);
	watch.setAttribute("name", name);
	watch.append(document.createElement("canvas"));
	figure.append(caption, watch);
	list.append(figure);
	players.set(name, figure);
}

/** Makes the players match `names`: new broadcasts get one, gone ones lose theirs. */
function showBroadcasts(names) {
	const wanted = new Set(names);
	for (const [name, figure] of players) {
		if (!wanted.has(name)) {
			figure.remove();
			players.delete(name);
		}
	}
	for (const name of [...wanted].sort()) {
		if (!players.has(name)) addPlayer(name);
	}
}

async function poll() {
	try {
		const response = await fetch(new URL("announced", relay), { cache: "no-store" });
		if (!response.ok) throw new Error(`HTTP ${response.status}`);
		const names = parseAnnounced(await response.text());
		showBroadcasts(names);
		status.textContent =
			names.length === 0
				? `no broadcasts on ${relay.host} yet`
				: `${names.length} broadcast${names.length === 1 ? "" : "s"} on ${relay.host}`;
	} catch (err) {
		status.textContent = `cannot list ${relay.host}'s broadcasts: ${err.message}`;
	}
}

if (only) {
	status.textContent = `${only} on ${relay.host}`;
	showBroadcasts([only]);
} else {
	await poll();
	setInterval(poll, POLL_MS);
}
