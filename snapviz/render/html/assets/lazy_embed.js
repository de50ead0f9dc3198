// Progressive embedding (loaded after BokehJS, before Bokeh's own embed call, which it
// replaces): the first screen's roots render at once; the others are added one at a time,
// each after the browser has painted, so the reader sees the verdict and the timeline while
// the plots below are still being built. Roots that share models are in one document
// (sources, ranges and selections stay linked); a document holding only later roots is not
// even deserialized until its turn, and the BokehJS bundles only such documents need
// (#sv-deferred-js, the tables) are compiled just before the first of them.
// `window.snapviz_pending` counts the roots not yet added (0 when the page is complete).
(function () {
  const Bokeh = window.Bokeh;
  const lazy = JSON.parse(document.getElementById("sv-lazy-roots").textContent);
  const lazyNames = new Set(lazy.roots);
  const lazyDocs = new Set(lazy.docs);
  const { Document } = Bokeh.require("document");
  const { unescape } = Bokeh.require("core/util/string");
  window.snapviz_pending = lazyNames.size;
  const loadDeferredJs = () => {
    const text = document.getElementById("sv-deferred-js");
    if (text === null || text.dataset.loaded) return;
    text.dataset.loaded = "1";
    const script = document.createElement("script");
    script.textContent = text.textContent;  // runs on insertion, synchronously
    document.head.appendChild(script);
  };
  Bokeh.embed.embed_items = async function (docs_json, render_items) {
    if (typeof docs_json === "string") docs_json = JSON.parse(unescape(docs_json));
    const views = [];
    const queue = [];  // steps run one per frame, in order
    const open = async (item) => {
      const doc = Document.from_json(docs_json[item.docid]);
      const elements = item.root_ids.map((id) => document.getElementById(item.roots[id]));
      const now = [];
      const later = [];
      // doc.roots() is in root_ids order (what Bokeh's embed relies on too)
      doc.roots().forEach((model, i) => (lazyNames.has(model.name) ? later : now).push([model, elements[i]]));
      for (const [model] of later) doc.remove_root(model);
      // add_document_standalone places the root at index i of all_roots into places[i]; a root
      // added back later lands at the end of all_roots, so its element is appended first.
      const places = now.map(([, el]) => el);
      views.push(await Bokeh.embed.add_document_standalone(doc, document.body, places, item.use_for_title));
      for (const [model, el] of later) {
        queue.push(() => {
          places.push(el);
          doc.add_root(model);
          window.snapviz_pending -= 1;
        });
      }
    };
    for (const item of render_items) {
      if (lazyDocs.has(item.docid)) {
        queue.push(async () => {
          loadDeferredJs();
          await open(item);
        });
      } else {
        await open(item);
      }
    }
    let waits = 0;
    const later = () => requestAnimationFrame(() => setTimeout(next, 0));  // paint between steps
    const next = async () => {
      // Each step waits until every root added so far has finished drawing (a few seconds at
      // most, should one never say so): the first screen is complete before anything below it
      // (or a deferred bundle) takes the main thread.
      if (waits++ < 300 && !Object.values(Bokeh.index).every((view) => view.has_finished())) return later();
      waits = 0;
      const step = queue.shift();
      if (step === undefined) return;
      await step();
      later();
    };
    later();
    return views;
  };
})();
