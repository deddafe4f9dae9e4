"""text_literal: a file built into fitrund as a C++ raw string literal, so nothing is found at run time."""

def text_literal(name, src, out, delimiter):
    """Writes `out`: the bytes of `src` as R"<delimiter>(...)<delimiter>", to #include where a string
    literal is wanted (the web pages, the Slurm rank shim). `delimiter` must not occur in `src`
    followed by a quote."""
    native.genrule(
        name = name,
        srcs = [src],
        outs = [out],
        cmd = "(printf 'R\"%s('; cat $<; echo ')%s\"') > $@" % (delimiter, delimiter),
    )
