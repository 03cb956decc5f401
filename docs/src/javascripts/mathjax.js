// MathJax configuration for the math of the Markdown pages (pymdownx.arithmatex in generic mode writes
// \( \) and \[ \]) and of the notebooks that mkdocs-jupyter renders ($ $ and $$ $$). The pages have no
// other dollar signs outside code, which MathJax skips.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
};

document$.subscribe(() => {
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
