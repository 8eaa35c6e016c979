"""`pipe docs`: a static, browsable site of the project (target/docs/): the lineage graph, a page
per table and source with its columns, their lineage and its latest commits.

    site.py     gathers the pages from the compiled plan, column lineage and the lake
    lake.py     each table's latest commits, read from its timeline (no Spark)
    layout.py   the graph's layered layout
    serve.py    `pipe docs serve`: the site on 127.0.0.1
    templates/, static/   the HTML, CSS and JavaScript (no library, nothing fetched)"""
