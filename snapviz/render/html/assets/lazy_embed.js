// Progressive embedding (loaded after BokehJS, before Bokeh's own embed call, which it
// replaces): the first screen's roots render at once; the others are taken out of the
// document and added back one at a time, each after the browser has painted, so the
// reader sees the verdict and the timeline while the plots below are still being built.
// Roots stay in one document: sources, ranges and selections remain shared.
// `window.snapviz_pending` counts the roots not yet added (0 when the page is complete).
(function () {
  const Bokeh = window.Bokeh;
  const lazyNames = new Set(JSON.parse(document.getElementById("sv-lazy-roots").textContent));
  const { Document } = Bokeh.require("document");
  const { unescape } = Bokeh.require("core/util/string");
  window.snapviz_pending = 0;
  Bokeh.embed.embed_items = async function (docs_json, render_items) {
    if (typeof docs_json === "string") docs_json = JSON.parse(unescape(docs_json));
    const views = [];
    for (const item of render_items) {
      const doc = Document.from_json(docs_json[item.docid]);
      const elements = item.root_ids.map((id) => document.getElementById(item.roots[id]));
      const all = doc.roots().slice();  // in root_ids order (what Bokeh's embed relies on too)
      const later = [];
      const now = [];
      all.forEach((model, i) => (lazyNames.has(model.name) ? later : now).push([model, elements[i]]));
      for (const [model] of later) doc.remove_root(model);
      // add_document_standalone places the root at index i of all_roots into places[i]; a root
      // added back later lands at the end of all_roots, so its element is appended first.
      const places = now.map(([, el]) => el);
      views.push(await Bokeh.embed.add_document_standalone(doc, document.body, places, item.use_for_title));
      window.snapviz_pending += later.length;
      const next = () => {
        const entry = later.shift();
        if (entry === undefined) return;
        places.push(entry[1]);
        doc.add_root(entry[0]);
        window.snapviz_pending -= 1;
        // one root per frame: paint between them
        requestAnimationFrame(() => setTimeout(next, 0));
      };
      requestAnimationFrame(() => setTimeout(next, 0));
    }
    return views;
  };
})();
