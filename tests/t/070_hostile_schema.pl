# The hostile schema (issue 12): a role that may create objects in the
# extension's schema and in public plants an overload of every function and
# operator the extension's own SQL refers to, and same-named objects in
# pg_temp; then every module runs.  No planted object may run as the
# extension's owner (or any definer, or the superuser the cleanup worker
# runs as), nothing may fail with "is not unique", and the workload, whose
# own calls are schema-qualified and exactly typed, reaches no plant.
#
# The list is derived, not hand-picked: the SQL texts are the string
# literals of the extension's C and the installed install and upgrade scripts;
# every identifier followed by "(" and every operator token is looked up
# in pg_proc / pg_operator of pg_catalog and of the extension's schema, and
# each match gets
#   (a) better-matching variants: one argument at a time replaced by a type
#       the call's argument could be without being the declared one
#       (integer where bigint is taken, name where text is, a concrete
#       type where a polymorphic or "any" one is), and a non-variadic or
#       concrete-variadic variant of a variadic function;
#   (b) equally-matching ones: the same argument types (for pg_catalog's
#       functions and operators, in public and the extension's schema),
#       and for the extension's functions with defaults, the same leading
#       arguments with fewer parameters, or one more defaulted parameter.
#
# The two kinds are planted in separate databases (an ambiguous equal plant
# would hide a better one that runs), three of each: plants made before
# CREATE EXTENSION (the install script), after it (the functions' own
# statements), and before ALTER EXTENSION UPDATE from the oldest version
# an upgrade starts from (the upgrade scripts).  The cleanup worker makes a pass over each kind's "after".
#
# With IDEM_SQL_SCRIPT (tests/suites/66_sql_edition.sh) the same attack is
# made on the SQL edition's plain script, on a server without pg_idem's
# library: the texts are the script's (every PL/pgSQL body), the superuser
# installs it with psql -f before and after the plants (there is no
# upgrade), its objects are the schema's that the superuser owns, and
# instead of the worker the superuser calls idem_cleanup, as a pg_cron job
# would.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $S = 'idem';    # the extension's schema, writable by the attacker
my $sql_script = $ENV{IDEM_SQL_SCRIPT};    # the SQL edition's plain script

my $node = PostgreSQL::Test::Cluster->new('hostile');
$node->init;
$node->append_conf('postgresql.conf', $sql_script ? "log_min_messages = warning\n" : qq{
shared_preload_libraries = 'pg_idem'
idem.database = 'better_after'
idem.cleanup_interval = '1d'
log_min_messages = warning
});
$node->start;

my $superuser = $node->safe_psql('postgres', 'SELECT current_user');

# --- The SQL texts the extension runs, and the names they refer to.
my (@c_files, @scripts, $oldest);
if ($sql_script)
{
	@scripts = ($sql_script);
	ok(-s $sql_script, "the SQL edition's plain script is here: $sql_script");
}
else
{
	@c_files = glob('extension/*.c extension/*/*.c');
	ok(scalar(@c_files) >= 5, 'the C sources are here: ' . scalar(@c_files) . ' files');
	my $sharedir = $node->config_data('--sharedir');
	# The current install script and every upgrade script, which an upgrade
	# from the oldest version runs.
	my $current = $node->safe_psql('postgres',
		"SELECT default_version FROM pg_available_extensions WHERE name = 'pg_idem'");
	$oldest = $node->safe_psql('postgres',
		"SELECT version FROM pg_available_extension_versions WHERE name = 'pg_idem'
		  ORDER BY string_to_array(version, '.')::int[] LIMIT 1");
	@scripts = (glob("$sharedir/extension/pg_idem--$current.sql"),
		glob("$sharedir/extension/pg_idem--*--*.sql"));
	ok(scalar(@scripts) >= 3, 'the install and upgrade scripts are installed: ' . scalar(@scripts));
}
# Installing: CREATE EXTENSION, or the plain script as psql runs it.
my $installing = $sql_script ? 'the plain script' : 'CREATE EXTENSION';
my $install = $sql_script ? "\\set schema $S\n\\i $sql_script\n" : "CREATE EXTENSION pg_idem SCHEMA $S";
# The objects installed (for the pg_temp stand-ins and the wrappers): the
# extension's, or the schema's that the installing superuser owns.
sub installed
{
	my ($catalog, $alias) = @_;
	return $sql_script
	  ? ($catalog eq 'pg_class'
		? "$alias.relnamespace OPERATOR(pg_catalog.=) '$S'::regnamespace::oid"
		  . " AND $alias.relowner OPERATOR(pg_catalog.<>) 'attacker'::regrole::oid"
		: "$alias.pronamespace OPERATOR(pg_catalog.=) '$S'::regnamespace::oid"
		  . " AND $alias.proowner OPERATOR(pg_catalog.<>) 'attacker'::regrole::oid")
	  : "EXISTS (SELECT FROM pg_depend d WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.$catalog'::regclass::oid"
	  . " AND d.objid OPERATOR(pg_catalog.=) $alias.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'::\"char\""
	  . " AND d.refobjid OPERATOR(pg_catalog.=) (SELECT oid FROM pg_extension"
	  . " WHERE extname OPERATOR(pg_catalog.=) 'pg_idem'::name))";
}

my $texts = '';
for my $f (@c_files)
{
	my $src = slurp_file($f);
	$src =~ s{/\*.*?\*/}{ }gs;    # comments
	$texts .= " $1" while $src =~ /"((?:[^"\\\n]|\\.)*)"/g;
}
for my $f (@scripts)
{
	my $src = slurp_file($f);
	$src =~ s/--[^\n]*//g;
	$texts .= " $src";
}
my (%fn, %op);
$fn{ lc $1 } = 1 while $texts =~ /\b([A-Za-z_][A-Za-z0-9_]*)\s*\(/g;
$op{$1} = 1 while $texts =~ m{([-+*/<>=~!@#%^&|`?]+)}g;
delete $op{$_} for grep { length($_) > 3 || /^--/ } keys %op;
my $fn_list = join(',', map { "'$_'" } sort keys %fn);
my $op_list = join(',', map { my $o = $_; $o =~ s/'/''/g; "'$o'" } sort keys %op);
note('identifiers before "(": ' . scalar(keys %fn) . ', operator tokens: ' . join(' ', sort keys %op));

# --- Roles and databases.
$node->safe_psql('postgres', qq{
	CREATE ROLE attacker LOGIN;
	CREATE ROLE app LOGIN;
	CREATE ROLE ops LOGIN;
});
$node->safe_psql('postgres', "CREATE DATABASE $_") for all_dbs();

# The databases: KIND_STAGE.
sub all_dbs
{
	my @stages = $sql_script ? qw(before after) : qw(before after upgraded);
	return map { my $k = $_; map { "${k}_$_" } @stages } qw(better equal);
}

# Every database: the attacker may create in public and in the schema the
# extension goes to, and owns the call log (schema hostile).
for my $db (all_dbs())
{
	$node->safe_psql($db, qq{
		GRANT CREATE ON SCHEMA public TO attacker;
		CREATE SCHEMA $S;
		GRANT CREATE ON SCHEMA $S TO attacker;
		CREATE SCHEMA hostile AUTHORIZATION attacker;
		CREATE SCHEMA app AUTHORIZATION app;
	});
	$node->safe_psql($db, q{
		CREATE TABLE hostile.calls (fn text, cur name, sess name);
		GRANT USAGE ON SCHEMA hostile TO PUBLIC;
		GRANT INSERT ON hostile.calls TO PUBLIC;
		CREATE TABLE hostile.plan (id serial PRIMARY KEY, ddl text UNIQUE, why text);
		-- Run one planting statement; false when the catalog refuses it.
		CREATE FUNCTION hostile.try(ddl text) RETURNS boolean LANGUAGE plpgsql AS $$
		BEGIN
			EXECUTE ddl;
			RETURN true;
		EXCEPTION WHEN OTHERS THEN
			RETURN false;
		END $$;
		-- What a pg_temp relation stand-in returns: a recorded call.
		CREATE FUNCTION hostile.rec(what text) RETURNS text LANGUAGE plpgsql AS $$
		BEGIN
			RAISE LOG 'hostile plant ran: % as % (session %)', what, current_user, session_user;
			INSERT INTO hostile.calls VALUES (what, current_user, session_user);
			RETURN NULL;
		END $$;
		GRANT EXECUTE ON FUNCTION hostile.rec(text) TO PUBLIC;
	}, extra_params => [ '-U', 'attacker' ]);
}

for my $kind (qw(better equal))
{
	$node->safe_psql("${kind}_after", $install);
	$node->safe_psql("${kind}_upgraded", "CREATE EXTENSION pg_idem SCHEMA $S VERSION '$oldest'")
	  unless $sql_script;
}

# --- The plan: derived in one "after", where the extension's functions exist.
my $P = 'better_after';
$node->safe_psql($P, q{
-- Types an argument of the declared type t could be, as a better match.
CREATE FUNCTION hostile.better(t regtype) RETURNS regtype[] LANGUAGE sql IMMUTABLE AS $$
	SELECT CASE
		WHEN t = 'bigint'::regtype THEN '{integer,smallint}'::regtype[]
		WHEN t = 'integer'::regtype THEN '{smallint}'::regtype[]
		WHEN t IN ('numeric'::regtype, 'double precision'::regtype, 'real'::regtype)
			THEN '{integer,bigint}'::regtype[]
		WHEN t = 'text'::regtype THEN '{name,character varying,"char"}'::regtype[]
		WHEN t = 'name'::regtype THEN '{text}'::regtype[]
		WHEN t = 'oid'::regtype THEN '{integer,regclass,regtype,regprocedure,regnamespace,regrole}'::regtype[]
		WHEN t = 'timestamp with time zone'::regtype
			THEN '{date,timestamp without time zone}'::regtype[]
		WHEN t IN ('anyelement'::regtype, 'anycompatible'::regtype, 'anynonarray'::regtype,
				   'anycompatiblenonarray'::regtype, '"any"'::regtype)
			THEN '{text,integer,bigint,uuid,jsonb,bytea,timestamptz,interval,boolean,name,regprocedure,regclass,"char"}'::regtype[]
		WHEN t IN ('anyarray'::regtype, 'anycompatiblearray'::regtype)
			THEN '{text[],integer[],bigint[],uuid[]}'::regtype[]
		ELSE '{}'::regtype[] END
$$;

-- A type a plpgsql plant may take as is.
CREATE FUNCTION hostile.plain(t regtype) RETURNS regtype LANGUAGE sql IMMUTABLE AS $$
	SELECT CASE WHEN t = '"any"'::regtype THEN 'text'::regtype ELSE t END
$$;

-- Queue the plant of a function s.name(args) [+ one defaulted integer].
CREATE FUNCTION hostile.add(s name, fname name, args regtype[], rt regtype, retset boolean,
							variadic_last boolean, extra_default boolean, why text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	arglist text;
	ret text;
	sig text;
BEGIN
	SELECT coalesce(string_agg(CASE WHEN variadic_last AND o = cardinality(args)
									THEN 'VARIADIC ' ELSE '' END
							   || pg_catalog.format_type(hostile.plain(a), NULL), ', ' ORDER BY o), '')
	  INTO arglist FROM unnest(args) WITH ORDINALITY AS u(a, o);
	IF extra_default THEN
		arglist := arglist || CASE WHEN arglist = '' THEN '' ELSE ', ' END || 'integer DEFAULT 0';
	END IF;
	ret := CASE WHEN rt = 'void'::regtype THEN 'void'
				WHEN (SELECT typtype FROM pg_catalog.pg_type WHERE oid = rt) = 'p' THEN 'text'
				ELSE pg_catalog.format_type(rt, NULL) END;
	sig := pg_catalog.format('%I.%I(%s) [%s]', s, fname, arglist, why);
	INSERT INTO hostile.plan (ddl, why) VALUES (pg_catalog.format(
		'CREATE FUNCTION %I.%I(%s) RETURNS %s%s LANGUAGE plpgsql AS %L',
		s, fname, arglist, CASE WHEN retset THEN 'SETOF ' ELSE '' END, ret,
		pg_catalog.format('BEGIN RAISE LOG ''hostile plant ran: %% as %% (session %%)'', %L, current_user, session_user;'
						  ' INSERT INTO hostile.calls VALUES (%L, current_user, session_user); RETURN%s; END',
						  sig, sig, CASE WHEN retset OR ret = 'void' THEN '' ELSE ' NULL' END)), why)
	ON CONFLICT DO NOTHING;
END $$;

-- Queue the plant of an operator s.op(l, r), by a recording function.
CREATE FUNCTION hostile.add_op(s name, opname name, l regtype, r regtype, rt regtype, why text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	fname text := 'opf_' || pg_catalog.left(pg_catalog.md5(pg_catalog.concat_ws('/', s, opname, l, r)), 16);
	ret text := CASE WHEN (SELECT typtype FROM pg_catalog.pg_type WHERE oid = rt) = 'p'
					 THEN 'boolean' ELSE pg_catalog.format_type(rt, NULL) END;
	sig text := pg_catalog.format('%I.%s(%s, %s) [%s]', s, opname,
								  coalesce(pg_catalog.format_type(l, NULL), 'NONE'),
								  pg_catalog.format_type(r, NULL), why);
BEGIN
	INSERT INTO hostile.plan (ddl, why) VALUES (pg_catalog.format(
		'CREATE FUNCTION hostile.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
		fname, concat_ws(', ', pg_catalog.format_type(l, NULL), pg_catalog.format_type(r, NULL)), ret,
		pg_catalog.format('BEGIN RAISE LOG ''hostile plant ran: %% as %% (session %%)'', %L, current_user, session_user;'
						  ' INSERT INTO hostile.calls VALUES (%L, current_user, session_user); RETURN NULL; END', sig, sig)), why)
	ON CONFLICT DO NOTHING;
	INSERT INTO hostile.plan (ddl, why) VALUES (pg_catalog.format(
		'CREATE OPERATOR %I.%s (FUNCTION = hostile.%I, %s RIGHTARG = %s)',
		s, opname, fname,
		CASE WHEN l IS NULL THEN '' ELSE pg_catalog.format('LEFTARG = %s,', pg_catalog.format_type(l, NULL)) END,
		pg_catalog.format_type(r, NULL)), why)
	ON CONFLICT DO NOTHING;
END $$;
}, extra_params => [ '-U', 'attacker' ]);

my $planned = $node->safe_psql($P, qq{
DO \$\$
DECLARE
	p record;
	s name;
	i integer;
	k integer;
	t regtype;
	v regtype[];
	n integer;
	unusable CONSTANT regtype[] := '{internal,cstring,trigger,event_trigger,language_handler,fdw_handler,index_am_handler,tsm_handler,table_am_handler}';
BEGIN
	FOR p IN
		SELECT pr.proname, nsp.nspname, pr.proargtypes::oid[]::regtype[] AS args,
			   pr.prorettype::regtype AS rt, pr.proretset, pr.provariadic <> 0 AS variadic,
			   pr.pronargdefaults AS ndefaults
		  FROM pg_catalog.pg_proc pr
		  JOIN pg_catalog.pg_namespace nsp ON nsp.oid = pr.pronamespace
		 WHERE pr.proname = ANY (ARRAY[$fn_list]::name[])
		   AND nsp.nspname IN ('pg_catalog', '$S')
		   AND pr.prokind IN ('f', 'a', 'w')
		   AND NOT pr.prorettype::regtype = ANY (unusable)
		   AND NOT pr.proargtypes::oid[]::regtype[] && unusable
	LOOP
		n := cardinality(p.args);
		FOREACH s IN ARRAY ARRAY['public', '$S']::name[] LOOP
			-- (a) better: one argument at a time
			FOR i IN 1 .. n LOOP
				FOREACH t IN ARRAY hostile.better(p.args[i]) LOOP
					v := p.args;
					v[i] := t;
					PERFORM hostile.add(s, p.proname, v, p.rt, p.proretset, false, false, 'better');
				END LOOP;
			END LOOP;
			-- (a) a variadic function: its arguments spelled out, or a concrete VARIADIC
			IF p.variadic THEN
				FOREACH t IN ARRAY '{text,integer,bigint}'::regtype[] LOOP
					FOR k IN 1 .. 3 LOOP
						PERFORM hostile.add(s, p.proname,
							p.args[1:n - 1] || array_fill(t, ARRAY[k]), p.rt, p.proretset, false, false, 'better');
					END LOOP;
					PERFORM hostile.add(s, p.proname,
						p.args[1:n - 1] || pg_catalog.format('%s[]', t)::regtype, p.rt, p.proretset, true, false, 'better');
				END LOOP;
			END IF;
			IF p.nspname = 'pg_catalog' THEN
				-- (b) equal: the same argument types
				PERFORM hostile.add(s, p.proname, p.args, p.rt, p.proretset, p.variadic, false, 'equal');
			ELSE
				-- (b) equal for calls that omit defaults: fewer parameters
				FOR k IN n - p.ndefaults .. n - 1 LOOP
					PERFORM hostile.add(s, p.proname, p.args[1:k], p.rt, p.proretset, false, false, 'equal');
				END LOOP;
				-- (b) equal for every call: one more, defaulted, parameter
				PERFORM hostile.add(s, p.proname, p.args, p.rt, p.proretset, false, true, 'equal');
			END IF;
		END LOOP;
	END LOOP;

	FOR p IN
		SELECT o.oprname, o.oprleft, o.oprright, o.oprresult
		  FROM pg_catalog.pg_operator o
		 WHERE o.oprname = ANY (ARRAY[$op_list]::name[])
		   AND o.oprnamespace = 'pg_catalog'::regnamespace
	LOOP
		FOREACH s IN ARRAY ARRAY['public', '$S']::name[] LOOP
			PERFORM hostile.add_op(s, p.oprname, nullif(p.oprleft, 0)::regtype, p.oprright::regtype,
								   p.oprresult::regtype, 'equal');
			IF p.oprleft <> 0 THEN
				FOREACH t IN ARRAY hostile.better(p.oprleft::regtype) LOOP
					PERFORM hostile.add_op(s, p.oprname, t, p.oprright::regtype, p.oprresult::regtype, 'better');
				END LOOP;
			END IF;
			FOREACH t IN ARRAY hostile.better(p.oprright::regtype) LOOP
				PERFORM hostile.add_op(s, p.oprname, nullif(p.oprleft, 0)::regtype, t,
									   p.oprresult::regtype, 'better');
			END LOOP;
		END LOOP;
	END LOOP;
END
\$\$;
SELECT count(*) FROM hostile.plan;
}, extra_params => [ '-U', 'attacker' ]);
cmp_ok($planned, '>', 500, "plants derived from the SQL texts: $planned statements");

# A plant must not take the place of one of the extension's own objects:
# in "before" that would make CREATE EXTENSION fail, which is no test.
my %plan_sql = map {
	$_ => $node->safe_psql($P, qq{
SELECT string_agg(pg_catalog.format('SELECT hostile.try(%L);', ddl), E'\\n' ORDER BY id)
  FROM hostile.plan WHERE why = '$_'})
} qw(better equal);

# The extension's relations and functions, for the pg_temp stand-ins.
my $temp_sql = $node->safe_psql($P, qq{
SELECT string_agg(stmt, E'\\n') FROM (
  SELECT pg_catalog.format('CREATE TEMP VIEW %I AS SELECT hostile.rec(%L) AS x;',
                           c.relname, 'pg_temp.' || c.relname) AS stmt
    FROM pg_catalog.pg_class c
   WHERE @{[ installed('pg_class', 'c') ]}
     AND c.relkind IN ('r', 'v', 'S')
  UNION ALL
  SELECT pg_catalog.format('CREATE FUNCTION pg_temp.%I(%s) RETURNS text LANGUAGE plpgsql AS %L;',
                           p.proname, pg_catalog.oidvectortypes(p.proargtypes),
                           pg_catalog.format('BEGIN PERFORM hostile.rec(%L); RETURN NULL; END',
                                             'pg_temp.' || p.proname))
    FROM pg_catalog.pg_proc p
   WHERE @{[ installed('pg_proc', 'p') ]}
     AND p.prorettype <> 'pg_catalog.trigger'::regtype
     -- (the SQL edition's internals: their types are for the owner only,
     -- and they are reached through casts, never by name)
     AND p.proname !~~ 'idem\\_\\_%') s});

# Plant in a database as the attacker; the number of plants made.
sub plant
{
	my ($db) = @_;
	my ($kind) = split /_/, $db;
	$node->safe_psql($db, $plan_sql{$kind}, extra_params => [ '-U', 'attacker' ]);
	return $node->safe_psql($db, q{
		SET search_path = pg_catalog;
		SELECT (SELECT count(*) FROM pg_catalog.pg_proc
		         WHERE pronamespace IN ('public'::regnamespace, 'idem'::regnamespace)
		           AND proowner = 'attacker'::regrole)
		     + (SELECT count(*) FROM pg_catalog.pg_operator
		         WHERE oprowner = 'attacker'::regrole)});
}

for my $db (all_dbs())
{
	my $planted = plant($db);
	cmp_ok($planted, '>', 200, "$db: $planted functions and operators planted");
}

# The workload calls the extension through wrappers in a schema only the
# superuser may create in, whose bodies (BEGIN ATOMIC) are bound to the
# extension's functions when they are created.  Called by name in a schema
# the attacker may create in, even an exactly typed call is ambiguous once
# the schema holds the same parameters plus one defaulted: that is what an
# application gets for installing into such a schema (the README says so),
# not a flaw of the extension's own SQL, which this test is about.  The
# attacker's functions are parked elsewhere while the wrappers are bound.
sub make_wrappers
{
	my ($db) = @_;
	$node->safe_psql($db, qq{
SET search_path = pg_catalog;
CREATE SCHEMA parked;
CREATE SCHEMA w;
GRANT USAGE ON SCHEMA w TO PUBLIC;
DO \$\$
DECLARE
	f record;
BEGIN
	FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
			  WHERE p.pronamespace OPERATOR(pg_catalog.=) '$S'::regnamespace::oid
			    AND p.proowner OPERATOR(pg_catalog.=) 'attacker'::regrole::oid
	LOOP
		EXECUTE format('ALTER FUNCTION %s SET SCHEMA parked', f.sig);
	END LOOP;
	FOR f IN SELECT p.proname, pg_get_function_arguments(p.oid) AS args,
					pg_get_function_result(p.oid) AS result, p.pronargs
			   FROM pg_proc p
			  WHERE @{[ installed('pg_proc', 'p') ]}
				AND p.prorettype OPERATOR(pg_catalog.<>) 'trigger'::regtype::oid
				AND p.proname OPERATOR(pg_catalog.!~~) 'idem\\_\\_%'::text
	LOOP
		EXECUTE format('CREATE FUNCTION w.%I(%s) RETURNS %s LANGUAGE sql BEGIN ATOMIC SELECT * FROM $S.%I(%s); END',
					   f.proname, f.args, f.result, f.proname,
					   (SELECT string_agg('\$' || i, ', ') FROM generate_series(1, f.pronargs) i));
	END LOOP;
	FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
			  WHERE p.pronamespace OPERATOR(pg_catalog.=) 'parked'::regnamespace::oid
	LOOP
		EXECUTE format('ALTER FUNCTION %s SET SCHEMA $S', f.sig);
	END LOOP;
END
\$\$;
DROP SCHEMA parked;
});
}

# Run SQL; fail the test on an error and show it.
my (@errors, %stderr);
sub run_sql
{
	my ($db, $role, $what, $sql) = @_;
	my ($out, $err) = ('', '');
	my $rc = $node->psql($db, $sql, stdout => \$out, stderr => \$err,
		on_error_stop => 1, extra_params => [ '-U', $role ]);
	$stderr{"$db/$what"} = $err;
	$err = join("\n", grep { !/^(psql:.*)?WARNING:|^(HINT|DETAIL):/ } split /\n/, $err);
	push @errors, "$db/$role/$what: $err" if $err =~ /is not unique/;
	is($rc . ($rc ? ": $err" : ''), '0', "$db: $what as $role");
	return $out;
}

for my $kind (qw(better equal))
{
	run_sql("${kind}_before", $superuser, "$installing with plants present", $install);
	like($stderr{"${kind}_before/$installing with plants present"},
		qr/WARNING:  schema "idem" is writable by roles that are not superusers\s+DETAIL:  Roles that may create objects in it: attacker\./,
		"${kind}_before: $installing warns that the attacker may create in the schema");
	next if $sql_script;
	run_sql("${kind}_upgraded", $superuser, "ALTER EXTENSION UPDATE from $oldest with plants present",
		'ALTER EXTENSION pg_idem UPDATE');
	like($stderr{"${kind}_upgraded/ALTER EXTENSION UPDATE from $oldest with plants present"},
		qr/WARNING:  schema "idem" is writable by roles that are not superusers/,
		"${kind}_upgraded: ALTER EXTENSION UPDATE warns too");
}

# --- CREATE EXTENSION warns about a target schema other roles may create
# in (the databases above: a WARNING naming the attacker), and not about a
# schema only a superuser may create in.  PostgreSQL 15's public, owned by
# pg_database_owner, is writable by a database owner that is no superuser.
$node->safe_psql('postgres', q{
	CREATE ROLE dbowner LOGIN;
	CREATE DATABASE owned OWNER dbowner;
	CREATE DATABASE quiet;
});
$node->safe_psql('quiet', 'CREATE SCHEMA idem');
for my $case ([ 'quiet', $install, '' ],
	[ 'owned', $sql_script ? "\\set schema public\n\\i $sql_script\n" : 'CREATE EXTENSION pg_idem', 'dbowner' ])
{
	my ($db, $sql, $who) = @$case;
	my $what = $sql_script ? 'the plain script' : $sql;
	my ($out, $err) = ('', '');
	$node->psql($db, $sql, stdout => \$out, stderr => \$err, on_error_stop => 1);
	if ($who eq '')
	{
		unlike($err, qr/is writable/, "$db: $what: no warning");
		next;
	}
	like($err, qr/WARNING:  schema "public" is writable by roles that are not superusers/,
		"$db: $what warns that public is writable");
	like($err, qr/DETAIL:  Roles that may create objects in it: \Q$who\E\./, "$db: the warning names $who");
	my $advice = $sql_script ? qr/psql -v schema=idem -f pg_idem_sql-[0-9.]+\.sql/
	  : qr/CREATE SCHEMA idem; CREATE EXTENSION pg_idem SCHEMA idem;/;
	like($err, qr/HINT:  Install pg_idem into a schema of its own.*$advice/, "$db: the warning says what to do");
}
{
	my ($out, $err) = ('', '');
	$node->psql('owned', $sql_script ? q{SELECT 1 WHERE to_regprocedure('public.idem_edition()') IS NOT NULL}
		: q{SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_idem'},
		stdout => \$out, stderr => \$err);
	is($out, '1', 'owned: the warning did not refuse the install');
}

# --- The workload, every call schema-qualified and exactly typed.
my $client_sql = q{
SELECT pg_catalog.sha256('body-1'::bytea) AS h1, pg_catalog.sha256('body-2'::bytea) AS h2 \gset
SELECT idem.idem_key('svc'::text, 'POST'::text, '/o'::text, 'k1-TAG'::text) AS k1,
       idem.idem_key('svc'::text, 'POST'::text, '/o'::text, 'k2-TAG'::text) AS k2,
       idem.idem_key('svc'::text, 'POST'::text, '/o'::text, 'k3-TAG'::text) AS k3,
       idem.idem_key('svc'::text, 'POST'::text, '/o'::text, 'k4-TAG'::text) AS k4,
       idem.idem_key('svc'::text, 'POST'::text, '/o'::text, 'k5-TAG'::text) AS k5 \gset
SELECT idem.idem_request_hash('body-1'::bytea) IS NOT NULL AS hashed;
-- claims: claim, renew, finalize, replay, mismatch, lookup
SELECT claim_id AS c1, outcome AS o_claim FROM idem.idem_claim(:'k1'::bytea, :'h1'::bytea, '30 seconds'::interval) \gset
\echo claim :o_claim
SELECT idem.idem_renew(:'k1'::bytea, :'c1'::uuid, '30 seconds'::interval) IS NOT NULL AS renewed;
SELECT idem.idem_finalize(:'k1'::bytea, :'c1'::uuid, 201::integer, '{"h": "v"}'::jsonb, 'done'::bytea, false::boolean) AS finalized;
SELECT outcome AS o_replay FROM idem.idem_claim(:'k1'::bytea, :'h1'::bytea, NULL::interval) \gset
\echo replay :o_replay
SELECT outcome AS o_mismatch FROM idem.idem_claim(:'k1'::bytea, :'h2'::bytea, NULL::interval) \gset
\echo mismatch :o_mismatch
SELECT outcome AS o_lookup FROM idem.idem_lookup(:'k1'::bytea, :'h1'::bytea) \gset
\echo lookup :o_lookup
-- release, fail
SELECT claim_id AS c2 FROM idem.idem_claim(:'k2'::bytea, :'h1'::bytea, NULL::interval) \gset
SELECT idem.idem_release(:'k2'::bytea, :'c2'::uuid) AS released;
SELECT claim_id AS c3 FROM idem.idem_claim(:'k3'::bytea, :'h1'::bytea, NULL::interval) \gset
SELECT idem.idem_fail(:'k3'::bytea, :'c3'::uuid, '0'::interval) AS failed;
-- steal: a lease that ran out is taken over
SELECT claim_id AS c4 FROM idem.idem_claim(:'k4'::bytea, :'h1'::bytea, '1 millisecond'::interval) \gset
SELECT pg_catalog.pg_sleep(0.05::double precision);
SELECT claim_id AS c4b, outcome AS o_steal FROM idem.idem_claim(:'k4'::bytea, :'h1'::bytea, NULL::interval) \gset
\echo steal :o_steal
SELECT idem.idem_finalize(:'k4'::bytea, :'c4b'::uuid, 200::integer, '{}'::jsonb, 'x'::bytea, false::boolean) AS finalized;
-- in-transaction mode
BEGIN;
SELECT claim_id AS c5, outcome AS o_begin FROM idem.idem_begin(:'k5'::bytea, :'h1'::bytea, NULL::interval) \gset
SELECT idem.idem_finalize(:'k5'::bytea, :'c5'::uuid, 200::integer, '{}'::jsonb, 'tx'::bytea, false::boolean) AS finalized;
COMMIT;
\echo begin :o_begin
-- inbox: begin/done, and a dead letter
BEGIN;
SELECT idem.idem_inbox_begin('cons-TAG'::text, 'm1'::text, :'h1'::bytea, 3::integer) AS ib_first \gset
SELECT idem.idem_inbox_done('cons-TAG'::text, 'm1'::text);
COMMIT;
\echo inbox :ib_first
BEGIN;
SELECT idem.idem_inbox_begin('cons-TAG'::text, 'm1'::text, :'h1'::bytea, 3::integer) AS ib_again \gset
COMMIT;
\echo inbox_again :ib_again
BEGIN;
SELECT idem.idem_inbox_begin('cons-TAG'::text, 'm2'::text, :'h1'::bytea, 1::integer);
SAVEPOINT handler;
ROLLBACK TO SAVEPOINT handler;
SELECT outcome AS ib_fail FROM idem.idem_inbox_fail('cons-TAG'::text, 'm2'::text, 'boom'::text) \gset
COMMIT;
\echo inbox_fail :ib_fail
-- outbox: stage, claim, ack; stage, claim, nack; wait
BEGIN;
SELECT idem.idem_outbox_stage('topic-TAG'::text, '{"n": 1}'::jsonb, 'key-TAG'::text, NULL::jsonb, '0'::interval) AS e1;
SELECT idem.idem_outbox_stage('topic-TAG'::text, 'raw'::bytea, 'key-TAG'::text, NULL::jsonb, '0'::interval) AS e2;
COMMIT;
SELECT claim_token AS tok, id AS ea FROM idem.idem_outbox_claim(1::integer, '30 seconds'::interval) \gset
SELECT idem.idem_outbox_ack(:'tok'::uuid, ARRAY[:'ea'::bigint]) AS acked;
SELECT claim_token AS tok2, id AS eb FROM idem.idem_outbox_claim(1::integer, '30 seconds'::interval) \gset
SELECT outcome AS nack FROM idem.idem_outbox_nack(:'tok2'::uuid, :'eb'::bigint, 'try later'::text) \gset
\echo nack :nack
SELECT idem.idem_outbox_wait('10 milliseconds'::interval) IS NOT NULL AS waited;
-- attempts: open, store, promote; open, fail, reopen (by open and by id)
SELECT attempt_id AS a1, decision AS d1 FROM idem.idem_attempt_open('hs_upload'::text, 'tgt-TAG'::text, 'r1'::text,
       'alice'::text, '{"n": 1}'::jsonb, 'a.pdf'::text, NULL::bytea) \gset
\echo attempt :d1
SELECT idem.idem_attempt_store(:'a1'::uuid, 1::bigint, pg_catalog.sha256('blob'::bytea)) AS stored;
SELECT idem.idem_attempt_promote(:'a1'::uuid, 1::bigint, pg_catalog.sha256('blob'::bytea), NULL::text, NULL::jsonb) AS promoted;
SELECT idem.idem_attempt_current('hs_upload'::text, 'tgt-TAG'::text) OPERATOR(pg_catalog.=) :'a1'::uuid AS is_current;
SELECT attempt_id AS a2 FROM idem.idem_attempt_open('hs_upload'::text, 'tgt-TAG'::text, 'r2'::text,
       'alice'::text, '{"n": 2}'::jsonb, 'b.pdf'::text, NULL::bytea) \gset
SELECT idem.idem_attempt_fail(:'a2'::uuid, 1::bigint, 'reaped_no_blob'::text, NULL::jsonb) AS failed;
SELECT decision AS d2 FROM idem.idem_attempt_open('hs_upload'::text, 'tgt-TAG'::text, 'r2'::text,
       'alice'::text, '{"n": 2}'::jsonb, 'b.pdf'::text, NULL::bytea) \gset
\echo reopen :d2
SELECT idem.idem_attempt_fail(:'a2'::uuid, 2::bigint, 'digest_mismatch'::text, '{"why": "x"}'::jsonb) AS failed;
SELECT idem.idem_attempt_reopen(:'a2'::uuid, 2::bigint) AS reopened_to;
SELECT idem.idem_attempt_object_key('hs'::text, 't'::text, :'a1'::uuid, 1::bigint, 'x y.pdf'::text) AS key,
       idem.idem_attempt_safe_name('../x y.pdf'::text) AS name,
       idem.idem_intent_hash('{"a": 1}'::jsonb) IS NOT NULL AS hashed;
-- the version guard on a table of the client's own
CREATE TABLE app.docs (id integer PRIMARY KEY, body text, version bigint NOT NULL DEFAULT 1);
CREATE TRIGGER docs_version BEFORE INSERT OR UPDATE ON app.docs
    FOR EACH ROW EXECUTE FUNCTION idem.idem_version_guard();
INSERT INTO app.docs (id, body) VALUES (1, 'a');
UPDATE app.docs SET body = 'b', version = 1::bigint WHERE id OPERATOR(pg_catalog.=) 1;
DO $$
BEGIN
	UPDATE app.docs SET body = 'c', version = 1::bigint WHERE id OPERATOR(pg_catalog.=) 1;
	RAISE EXCEPTION 'a stale write was accepted';
EXCEPTION WHEN SQLSTATE 'IL004' THEN
	NULL;
END $$;
SELECT version AS doc_version FROM app.docs \gset
\echo version :doc_version
};

my $admin_sql = q{
SELECT idem.idem_attempt_register_kind('hs_upload'::text, 'replace'::text, 'hs'::text) IS NOT NULL AS registered;
};

my $admin_after_sql = q{
SELECT count(*) AS reconcile FROM idem.idem_attempt_reconcile_batch('0'::interval, 100::integer);
SELECT attempt_id AS sa, generation AS sg FROM idem.idem_attempt_sweep_batch('0'::interval, 100::integer) LIMIT 1 \gset
SELECT idem.idem_attempt_swept(:'sa'::uuid, :'sg'::bigint) AS swept;
SELECT idem.idem_attempt_prune('0'::interval, 100::integer) IS NOT NULL AS pruned;
SELECT idem.idem_outbox_prune('0'::interval, 1000::integer) IS NOT NULL AS outbox_pruned;
SELECT idem.idem_inbox_prune('0'::interval, 1000::integer) IS NOT NULL AS inbox_pruned;
SELECT idem.idem_inbox_retry('cons-app'::text, 'm2'::text) IS NOT NULL AS retried;
SELECT idem.idem_cleanup(1000::integer) IS NOT NULL AS cleaned;
SELECT idem.idem_evict(idem.idem_key('svc'::text, 'POST'::text, '/o'::text, 'k1-app'::text)) AS evicted;
SELECT count(*) AS n FROM idem.idem_stats;
SELECT count(*) AS n FROM idem.idem_inflight;
SELECT count(*) AS n FROM idem.idem_stuck;
SELECT count(*) AS n FROM idem.idem_cooling;
SELECT count(*) AS n FROM idem.idem_outbox_dead;
SELECT count(*) AS n FROM idem.idem_inbox_dead;
};

make_wrappers($_) for all_dbs();
$node->safe_psql('postgres', q{
	GRANT idem_client TO app;
	GRANT idem_admin TO ops;
	GRANT idem_client TO attacker;
});

s/\bidem\.idem_(?!version_guard|stats\b|inflight|stuck|cooling|outbox_dead|inbox_dead)/w.idem_/g
  for ($client_sql, $admin_sql, $admin_after_sql);
for my $db (all_dbs())
{
	run_sql($db, 'ops', 'admin set-up', $temp_sql . $admin_sql);
	# The victim's session holds pg_temp stand-ins of every relation and
	# function of the extension; so does the attacker's, calling as a client.
	for my $role (qw(app attacker))
	{
		$node->safe_psql($db, "GRANT USAGE, CREATE ON SCHEMA app TO attacker") if $role eq 'attacker';
		my $sql = $client_sql;
		$sql =~ s/app\.docs/app.docs_$role/g;
		$sql =~ s/TAG/$role/g;
		my $out = run_sql($db, $role, 'client workload', $temp_sql . $sql);
		like($out, qr/claim claimed.*replay replay.*mismatch mismatch.*lookup replay.*steal recovered_abandoned.*begin claimed.*inbox process.*inbox_again duplicate.*inbox_fail dead.*nack retry.*attempt new.*reopen reopened.*version 2/s,
			"$db: the $role workload's outcomes");
	}
	run_sql($db, 'ops', 'admin workload', $temp_sql . $admin_after_sql);
}

# --- The cleanup worker (a superuser) runs a pass over each kind's "after"
# (better_after first: idem.database is read at server start); in the SQL
# edition the superuser calls idem_cleanup in each.
# (PostgreSQL before 17 refuses ALTER SYSTEM for a placeholder setting:
# without the library, the databases' settings.)
if ($sql_script)
{
	$node->safe_psql('postgres', "ALTER DATABASE ${_}_after SET idem.ttl = '1s';"
		  . " ALTER DATABASE ${_}_after SET idem.tombstone_ttl = 0;") for qw(better equal);
}
else
{
	$node->safe_psql('postgres', q{
		ALTER SYSTEM SET idem.ttl = '1s';
		ALTER SYSTEM SET idem.tombstone_ttl = 0;
		ALTER SYSTEM SET idem.cleanup_interval = '1s';
		SELECT pg_reload_conf();
	});
}

# Finished keys are gone once a pass ran (30 s at most: the interval is 1 s).
sub worker_pass
{
	my ($db) = @_;
	my $left;
	for (1 .. 60)
	{
		# (through the wrapper: by name, the equal plants make it ambiguous)
		run_sql($db, $superuser, 'idem_cleanup', 'SET search_path = pg_catalog; SELECT w.idem_cleanup(1000::integer)')
		  if $sql_script && $_ > 1;
		$left = $node->safe_psql($db,
			"SELECT pg_catalog.count(*) FROM idem.idem_keys"
			  . " WHERE state OPERATOR(pg_catalog.<>) 'pending'::pg_catalog.text");
		last if $left eq '0';
		usleep(500_000);
	}
	return $left;
}
is(worker_pass('better_after'), '0', 'the cleanup worker ran a pass over better_after');
unless ($sql_script)
{
	$node->append_conf('postgresql.conf', "idem.database = 'equal_after'");
	$node->stop('immediate');
	$node->start;
}
# The worker runs no SQL text (launcher.c, worker.c): equally matching
# overloads cannot make its calls ambiguous.
is(worker_pass('equal_after'), '0', 'the cleanup worker ran a pass over equal_after');

# --- The recorder works: a plant called on purpose (a better match for an
# integer argument of format) logs its call; the probe's row is removed.
$node->safe_psql('better_after', q{
	SET search_path = pg_catalog;
	SELECT public.format('%s'::text, 1::integer);
}, extra_params => [ '-U', 'app' ]);
is( $node->safe_psql('better_after', q{
		SET search_path = pg_catalog;
		DELETE FROM hostile.calls WHERE fn OPERATOR(pg_catalog.~~) 'public.format(text, integer)%'::text
		RETURNING cur;
	}, extra_params => [ '-U', 'attacker' ]),
	'app', 'a plant records its calls (the probe ran as app)');

# --- The verdict.
my $privileged = q{
	SELECT rolname FROM pg_catalog.pg_roles WHERE rolsuper
	UNION SELECT e.extowner::regrole::name FROM pg_catalog.pg_extension e WHERE extname = 'pg_idem'
	UNION SELECT p.proowner::regrole::name FROM pg_catalog.pg_proc p WHERE p.prosecdef
	  AND p.pronamespace = 'idem'::regnamespace AND p.proowner <> 'attacker'::regrole
};
for my $db (all_dbs())
{
	my $ran = $node->safe_psql($db, qq{
		SET search_path = pg_catalog;
		SELECT fn || ' as ' || cur || ' (session ' || sess || ')'
		  FROM hostile.calls WHERE cur IN ($privileged) ORDER BY 1});
	is($ran, '', "$db: no planted object ran as the extension's owner, a definer or a superuser");
	my $any = $node->safe_psql($db, q{
		SET search_path = pg_catalog;
		SELECT fn || ' as ' || cur || ' (session ' || sess || ')' FROM hostile.calls ORDER BY 1});
	is($any, '', "$db: no planted object ran at all");
}
# A plant whose call made its statement fail left no row (it rolled
# back), but its LOG line stays in the server log.
{
	my @privileged = split /\n/, $node->safe_psql('better_after', "SET search_path = pg_catalog; $privileged");
	my %is_privileged = map { $_ => 1 } @privileged;
	my @ran = (slurp_file($node->logfile) =~ /LOG:  hostile plant ran: (.*? as (\S+) \(session \S+\))/g);
	my (@as_privileged, @all);
	while (my ($line, $cur) = splice(@ran, 0, 2))
	{
		next if $line =~ /^public\.format\(text, integer\)/ && $cur eq 'app';    # the probe
		push @all, $line;
		push @as_privileged, $line if $is_privileged{$cur};
	}
	is(join("\n", @as_privileged), '', 'server log: no plant ran as the owner, a definer or a superuser');
	is(join("\n", @all), '', 'server log: no plant ran at all');
}

# The sessions' errors, and the server log's lines of backends (the
# worker's are logged without an application name: 070_hostile_schema.pl
# is psql's).  Line by line: /^.*is not unique.*$/mg over the whole log
# takes minutes.
my @log_not_unique = grep { /is not unique/ } split /\n/, slurp_file($node->logfile);
my @not_unique = grep { /070_hostile_schema/ } @log_not_unique;
is(join("\n", @errors, @not_unique), '', 'no session failed with "is not unique"');
{
	my @worker = grep { !/070_hostile_schema/ } @log_not_unique;
	is(join("\n", @worker), '', 'the cleanup worker did not fail with "is not unique"');
}

$node->stop;
done_testing();
