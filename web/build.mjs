// Builds dist/: the watch page (index.html) and the browser publisher (publish.html), each
// with its script bundled by esbuild into one ES module, so the relay serves plain files.
import { copyFile, mkdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const root = dirname(fileURLToPath(import.meta.url));
const src = join(root, "src");
const dist = join(root, "dist");

await rm(dist, { recursive: true, force: true });
await mkdir(dist, { recursive: true });
await esbuild.build({
	entryPoints: [join(src, "watch.js"), join(src, "publish.js")],
	outdir: dist,
	bundle: true,
	format: "esm",
	target: "es2022",
	minify: true,
	sourcemap: true,
	logLevel: "warning",
});
for (const page of ["index.html", "publish.html", "style.css"]) {
	await copyFile(join(src, page), join(dist, page));
}
console.log(`built ${dist}`);
