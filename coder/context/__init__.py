"""What the model is shown about the repository, and how an edit is checked, built from the code
itself with tree-sitter.

    languages.py     file name -> tree-sitter language; parsers (a grammar wheel per language)
    tags.py          definitions and references of one file (tree-sitter queries)
    syntax.py        the first syntax error of a file, shown with numbered lines around it
    blobcache.py     per-blob results cached under .coder/cache/ (content-addressed)
    repomap.py       the ranked repository map: PageRank over the reference graph, cut to a
                     token budget, built from a commit and cached by its tree
    retrieval.py     code_search: BM25 over code chunks, optional embeddings fused by
                     reciprocal rank
    instructions.py  AGENTS.md and friends, read from a commit, capped and redacted

tree_sitter and the grammars are imported inside the functions that use them: `coder --help`
never pays for them.

May import: git, policy and the base modules. Never models, tools, agent, run or CLI.
"""
