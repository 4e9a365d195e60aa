"""Which queries `arena sql` runs on the team store: reads of the store's tables with harmless
built-in functions, nothing else, judged on PostgreSQL's own parse tree.

A READ ONLY transaction stops writes, not side effects: a read-only query can still end other
connections (`pg_terminate_backend`), hold an advisory lock every run waits for
(`pg_advisory_lock` + `pg_sleep`), read the server's files as a superuser (`pg_read_file`), or
hand any of them to a function that runs a query given as a string (`query_to_xml`, `ts_stat`),
around every check of the query's text. So the query is parsed with PostgreSQL's parser
(pglast, i.e. libpg_query) and accepted only when it is exactly one SELECT, VALUES, TABLE, WITH
or EXPLAIN of one, and everything in its tree is on an allow-list: the node kinds of a query
(no SELECT INTO, no FOR UPDATE/SHARE), functions from `ALLOWED_FUNCTIONS` (unqualified or
``pg_catalog.``), types from `ALLOWED_TYPES`, and relations that are the store's tables and views
(`STORE_RELATIONS`) or the query's own CTEs, in scope. An allow-list, not a deny-list: a
function nobody thought of is refused. What the parse tree cannot tell, the server is asked
(`shadowing_sql`): that no function, operator or type of the names the query uses exists
outside pg_catalog, so every name means the built-in.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

STORE_RELATIONS = frozenset({"runs", "task_results", "steps", "latest_task_results", "schema_version",
                             "shard_tickets"})
"""The store's tables and views (adapters/store/duckdb_store.py `_DDL` and `schema_version`;
tests/store/test_team_sql_boundaries.py checks that a new store has exactly these, so a table
added there is readable here only once it is added to this list)."""

# Harmless built-ins: each computes its result from its arguments (and the clock or a random
# number), and none reads files, settings or other tables, signals, locks, sleeps, or runs SQL.
ALLOWED_FUNCTIONS = frozenset({
    # aggregates
    "avg", "bit_and", "bit_or", "bit_xor", "bool_and", "bool_or", "count", "every", "max", "min", "sum",
    "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp", "corr", "covar_pop",
    "covar_samp", "regr_avgx", "regr_avgy", "regr_count", "regr_intercept", "regr_r2", "regr_slope",
    "regr_sxx", "regr_sxy", "regr_syy", "mode", "percentile_cont", "percentile_disc", "string_agg",
    "array_agg", "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg", "any_value",
    # window functions
    "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
    "first_value", "last_value", "nth_value",
    # math
    "abs", "cbrt", "ceil", "ceiling", "degrees", "div", "exp", "factorial", "floor", "gcd", "lcm", "ln",
    "log", "log10", "min_scale", "mod", "pi", "power", "pow", "radians", "round", "scale", "sign",
    "sqrt", "trunc", "trim_scale", "width_bucket", "random", "acos", "asin", "atan", "atan2", "cos",
    "cot", "sin", "tan", "sinh", "cosh", "tanh", "acosd", "asind", "atand", "atan2d", "cosd", "cotd",
    "sind", "tand",
    # strings
    "ascii", "bit_length", "btrim", "char_length", "character_length", "chr", "concat", "concat_ws",
    "format", "initcap", "left", "length", "lower", "lpad", "ltrim", "md5", "octet_length", "overlay",
    "position", "quote_ident", "quote_literal", "quote_nullable", "regexp_count", "regexp_instr",
    "regexp_like", "regexp_match", "regexp_matches", "regexp_replace", "regexp_split_to_array",
    "regexp_split_to_table", "regexp_substr", "repeat", "replace", "reverse", "right", "rpad", "rtrim",
    "split_part", "starts_with", "strpos", "substr", "substring", "to_hex", "translate", "upper",
    "normalize", "is_normalized", "sha224", "sha256", "sha384", "sha512", "encode", "decode",
    "string_to_array", "string_to_table", "array_to_string", "like_escape", "similar_to_escape",
    "similar_escape", "convert_from", "convert_to",
    # dates and times
    "age", "clock_timestamp", "date_bin", "date_part", "date_trunc", "extract", "isfinite",
    "justify_days", "justify_hours", "justify_interval", "make_date", "make_interval", "make_time",
    "make_timestamp", "make_timestamptz", "now", "statement_timestamp", "timeofday",
    "transaction_timestamp", "to_timestamp", "to_char", "to_date", "to_number", "timezone", "overlaps",
    # JSON
    "to_json", "to_jsonb", "row_to_json", "array_to_json", "json_build_array", "json_build_object",
    "jsonb_build_array", "jsonb_build_object", "json_object", "jsonb_object", "json_array_length",
    "jsonb_array_length", "json_array_elements", "json_array_elements_text", "jsonb_array_elements",
    "jsonb_array_elements_text", "json_each", "json_each_text", "jsonb_each", "jsonb_each_text",
    "json_extract_path", "json_extract_path_text", "jsonb_extract_path", "jsonb_extract_path_text",
    "json_object_keys", "jsonb_object_keys", "json_typeof", "jsonb_typeof", "json_strip_nulls",
    "jsonb_strip_nulls", "jsonb_pretty", "jsonb_set", "jsonb_set_lax", "jsonb_insert",
    "json_populate_record", "json_populate_recordset", "jsonb_populate_record",
    "jsonb_populate_recordset", "json_to_record", "json_to_recordset", "jsonb_to_record",
    "jsonb_to_recordset", "jsonb_path_exists", "jsonb_path_match", "jsonb_path_query",
    "jsonb_path_query_array", "jsonb_path_query_first", "jsonb_path_exists_tz", "jsonb_path_match_tz",
    "jsonb_path_query_tz", "jsonb_path_query_array_tz", "jsonb_path_query_first_tz",
    # arrays and sets
    "array_append", "array_cat", "array_dims", "array_length", "array_lower", "array_ndims",
    "array_position", "array_positions", "array_prepend", "array_remove", "array_replace",
    "array_upper", "cardinality", "trim_array", "unnest", "generate_series", "generate_subscripts",
    # the rest
    "num_nulls", "num_nonnulls", "pg_typeof", "gen_random_uuid",
})

# Types a query may cast to, as PostgreSQL's parser names them (`integer` is pg_catalog.int4).
ALLOWED_TYPES = frozenset({
    "bool", "boolean", "int2", "int4", "int8", "smallint", "integer", "int", "bigint", "numeric", "decimal",
    "float4", "float8", "real", "text", "varchar", "bpchar", "char", "date", "time", "timetz", "timestamp",
    "timestamptz", "interval", "json", "jsonb", "jsonpath", "uuid", "bytea",
})

TABLESAMPLE_METHODS = frozenset({"system", "bernoulli"})
EXPLAIN_OPTIONS = frozenset({"analyze", "verbose", "costs", "settings", "generic_plan", "buffers", "serialize",
                             "wal", "timing", "summary", "memory", "format"})

# The node kinds of a query's parse tree. Anything else (a data-modifying CTE, SELECT INTO, XML
# and SQL/JSON syntax, a DO block ...) is refused by its kind.
_QUERY_NODES = frozenset({
    "SelectStmt", "ResTarget", "ColumnRef", "A_Star", "A_Const", "Integer", "Float", "Boolean", "String",
    "BitString", "A_Expr", "BoolExpr", "NullTest", "BooleanTest", "FuncCall", "WindowDef", "SortBy",
    "RangeVar", "JoinExpr", "RangeSubselect", "RangeFunction", "Alias", "WithClause", "CommonTableExpr",
    "CTESearchClause", "CTECycleClause", "SubLink", "CaseExpr", "CaseWhen", "CoalesceExpr", "MinMaxExpr",
    "TypeCast", "TypeName", "A_Indirection", "A_Indices", "A_ArrayExpr", "RowExpr", "CollateClause",
    "GroupingSet", "GroupingFunc", "ParamRef", "SQLValueFunction", "RangeTableSample", "ColumnDef",
})

# Why a few well-known functions are refused, for the refusal's line (any other: not on the list).
_REASONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("pg_terminate_backend", "pg_cancel_backend", "pg_signal_"), "it signals other connections to the store"),
    (("pg_advisory", "pg_try_advisory"), "it takes a lock that other connections (a starting run) wait for"),
    (("pg_read_", "pg_ls_", "pg_stat_file", "lo_", "pg_file"), "it reads files on the database server"),
    (("query_to_xml", "cursor_to_xml", "table_to_xml", "schema_to_xml", "database_to_xml", "ts_stat",
      "ts_rewrite"), "it runs a query given as a string, around every check"),
    (("pg_sleep",), "it holds the connection while it sleeps"),
    (("set_config", "current_setting", "pg_reload_conf", "pg_rotate_logfile"), "it reads or changes server settings"),
    (("dblink",), "it connects to other servers"),
    (("nextval", "setval", "currval"), "it uses sequences"),
)


class QueryRefused(ValueError):
    """A query `arena sql` does not run, with the one line saying which part and why."""


@dataclass
class CheckedQuery:
    """What a query accepted by `check_query` uses, for the server's check (`shadowing_sql`)."""

    functions: set[str] = field(default_factory=set)
    operators: set[str] = field(default_factory=set)
    types: set[str] = field(default_factory=set)


def refusal_reason(function: str) -> str:
    """Why `function` is not run, in words for the refusal's line."""
    for prefixes, reason in _REASONS:
        if function.startswith(prefixes):
            return reason
    return ("it is not on arena sql's list of harmless built-ins (aggregates, window functions, math, "
            "strings, dates, JSON, arrays)")


def check_query(sql: str, relations: Iterable[str] = STORE_RELATIONS) -> CheckedQuery:
    """The functions, operators and types `sql` uses, when it is one query `arena sql` may run;
    `QueryRefused` naming the part and why otherwise (also for SQL that does not parse)."""
    try:
        from pglast import parse_sql
        from pglast.parser import ParseError
    except ImportError:
        raise QueryRefused("arena sql on the team store needs pglast (PostgreSQL's parser) to check the query; "
                           "install the team extra (pip install 'waa-arena[team]')") from None

    try:
        return _checked(parse_sql(sql), frozenset(relations))
    except ParseError as exc:
        raise QueryRefused(f"arena sql refuses the query: it does not parse: {exc.args[0]}") from None
    except RecursionError:
        raise QueryRefused("arena sql refuses the query: it is nested too deeply to check") from None


def _checked(statements: Any, relations: frozenset[str]) -> CheckedQuery:
    """`check_query` on the parsed statements."""
    if len(statements) != 1:
        raise QueryRefused(f"arena sql runs exactly one statement; this has {len(statements)}")
    walker = _Walker(relations)
    statement = statements[0].stmt
    kind = type(statement).__name__
    if kind == "ExplainStmt":
        for option in statement.options or ():
            if option.defname not in EXPLAIN_OPTIONS:
                raise QueryRefused(f"arena sql refuses EXPLAIN option {option.defname.upper()}")
        statement = statement.query
        kind = type(statement).__name__
    if kind != "SelectStmt":
        raise QueryRefused(f"arena sql runs queries only (SELECT, VALUES, TABLE, WITH, EXPLAIN); "
                           f"{_kind_words(kind)} is not one")
    walker.visit(statement, frozenset())
    return walker.found


def _kind_words(kind: str) -> str:
    """A node kind as words: 'InsertStmt' -> 'INSERT'."""
    return kind.removesuffix("Stmt").upper() if kind.endswith("Stmt") else kind


def _qualified(names: tuple[Any, ...], what: str) -> str:
    """The name of a function, operator or type given as parts; QueryRefused when it is qualified
    by another schema than pg_catalog (a function of anyone's, not the built-in)."""
    parts = [getattr(part, "sval", "") for part in names]
    if len(parts) == 2 and parts[0] == "pg_catalog":
        return parts[1]
    if len(parts) != 1:
        raise QueryRefused(f"arena sql refuses {what} {'.'.join(parts)}: only built-ins run, unqualified or as "
                           "pg_catalog.NAME")
    return parts[0]


class _Walker:
    """Visits a parse tree, refusing what is not on the allow-lists (CTE names in scope)."""

    def __init__(self, relations: frozenset[str]) -> None:
        self.relations = relations
        self.found = CheckedQuery()

    def visit(self, node: Any, ctes: frozenset[str]) -> None:
        if node is None or isinstance(node, (str, int, float, bool, enum.Enum)):
            return
        if isinstance(node, (tuple, list)):
            for item in node:
                self.visit(item, ctes)
            return
        kind = type(node).__name__
        if kind not in _QUERY_NODES:
            raise QueryRefused(f"arena sql refuses {_kind_words(kind)}: not part of a plain query")
        handler = getattr(self, f"_{kind}", None)
        if handler is not None:
            handler(node, ctes)
        else:
            self.children(node, ctes)

    def children(self, node: Any, ctes: frozenset[str], skip: tuple[str, ...] = ()) -> None:
        for name in node:
            if name not in skip:
                self.visit(getattr(node, name), ctes)

    def _SelectStmt(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802 - the node's name
        if node.intoClause is not None:
            raise QueryRefused("arena sql refuses SELECT INTO: it creates a table")
        if node.lockingClause:
            raise QueryRefused("arena sql refuses FOR UPDATE/SHARE: it locks rows other connections then wait for")
        scope = ctes
        if node.withClause is not None:
            names = [cte.ctename for cte in node.withClause.ctes]
            for index, cte in enumerate(node.withClause.ctes):
                # A CTE sees the ones before it (all of them, itself included, under RECURSIVE);
                # a name out of scope is a real relation of that name.
                seen = names if node.withClause.recursive else names[:index]
                self.visit(cte, ctes | frozenset(seen))
            scope = ctes | frozenset(names)
        self.children(node, scope, skip=("withClause",))

    def _RangeVar(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        name = ".".join(part for part in (node.catalogname, node.schemaname, node.relname) if part)
        if node.catalogname or node.schemaname or (node.relname not in ctes and node.relname not in self.relations):
            raise QueryRefused(f"arena sql refuses relation {name}: a query reads only the store's tables "
                               f"and views ({', '.join(sorted(self.relations))}) and its own WITH queries")

    def _FuncCall(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        name = _qualified(node.funcname, "function")
        if name not in ALLOWED_FUNCTIONS:
            raise QueryRefused(f"arena sql refuses function {name}(): {refusal_reason(name)}")
        self._uses(self.found.functions, node.funcname, name)
        self.children(node, ctes, skip=("funcname",))

    def _A_Expr(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        self._uses(self.found.operators, node.name, _qualified(node.name, "operator"))
        self.children(node, ctes, skip=("name",))

    def _SubLink(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        if node.operName:
            self._uses(self.found.operators, node.operName, _qualified(node.operName, "operator"))
        self.children(node, ctes, skip=("operName",))

    def _TypeName(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        name = _qualified(node.names, "type")
        if name not in ALLOWED_TYPES or node.setof or node.pct_type:
            raise QueryRefused(f"arena sql refuses type {name}: casts go to the ordinary built-in types "
                               f"({', '.join(sorted(ALLOWED_TYPES))})")
        self._uses(self.found.types, node.names, name)
        self.children(node, ctes, skip=("names",))

    def _ColumnRef(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        # `r.f` may call a function f(r) (PostgreSQL's functional notation): the server's check
        # makes sure no such name is a function outside pg_catalog.
        self._fields(node.fields, ctes)

    def _A_Indirection(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        self._fields(node.indirection, ctes)
        self.children(node, ctes, skip=("indirection",))

    def _fields(self, fields: Any, ctes: frozenset[str]) -> None:
        for part in fields or ():
            if type(part).__name__ == "String":
                self.found.functions.add(part.sval)
            else:
                self.visit(part, ctes)  # `*`, or a subscript [i], whose expressions are checked

    def _SortBy(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        if node.useOp:  # ORDER BY x USING op
            self._uses(self.found.operators, node.useOp, _qualified(node.useOp, "operator"))
        self.children(node, ctes, skip=("useOp",))

    @staticmethod
    def _uses(found: set[str], names: tuple[Any, ...], name: str) -> None:
        # Only an unqualified name can resolve outside pg_catalog: the server's check looks at those.
        if len(names) == 1:
            found.add(name)

    def _RangeTableSample(self, node: Any, ctes: frozenset[str]) -> None:  # noqa: N802
        method = _qualified(node.method, "TABLESAMPLE method")
        if method not in TABLESAMPLE_METHODS:
            raise QueryRefused(f"arena sql refuses TABLESAMPLE {method}: only system or bernoulli")
        self.children(node, ctes, skip=("method",))


def shadowing_sql() -> str:
    """A query (parameters: function, operator and type names) giving the first one of those
    names that also exists outside pg_catalog, as 'function public.lower', or no row: an
    unqualified name may then resolve to it instead of the built-in."""
    return """
        SELECT kind || ' ' || nspname || '.' || name FROM (
            SELECT 'function' AS kind, p.pronamespace AS ns, p.proname::text AS name FROM pg_proc p
            WHERE p.proname = ANY(%s)
            UNION ALL
            SELECT 'operator', o.oprnamespace, o.oprname::text FROM pg_operator o WHERE o.oprname = ANY(%s)
            UNION ALL
            SELECT 'type', t.typnamespace, t.typname::text FROM pg_type t WHERE t.typname = ANY(%s)
        ) used JOIN pg_namespace n ON n.oid = used.ns
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
        ORDER BY 1 LIMIT 1
    """
