# The pieces of the hostile-roles suite (073_hostile_roles.pl): the
# attacker's plant and the judge that compares the state tables.
#
# The plant (schema "intruder", owned by the attacking role) calls every
# SQL-callable function of pg_idem, found in pg_depend, never a list: a
# function added to the extension is attacked the day it exists.  Each
# function is called twice per target set, with the same arguments except
# the identifiers: once with the victim's (its cache keys and claim ids,
# inbox messages, outbox events and claim tokens, attempts), once with
# "ghost" identifiers nobody has, ghost first: the attacker does the same
# to both, so its own state on the two is the same.  The two answers, with
# the identifiers replaced by their parameter names, must be equal, or the
# answer tells whether the victim's object exists.  (A function called
# without any identifier is called once.)  Each call is kept when the
# transaction could commit with it (SET CONSTRAINTS ALL IMMEDIATE in a
# subtransaction fires pg_idem's deferred checks), so that any effect on
# the victim's rows is committed for the judge to see.
#
# The judge (schema "judge", the superuser's) snapshots every table of
# the extension (pg_depend again) and lists the rows that changed,
# appeared or went away and do not belong to the attacker's scope.
#
# With IDEM_SQL_SCRIPT (tests/suites/66_sql_edition.sh) the extension is
# the SQL edition's plain script, installed into schema idem: its objects
# are those of the schema (the attacker's are in its own), and its
# internal functions (idem__*, reached through casts) are attacked apart,
# by 073_hostile_roles.pl.
package HostileRoles;

use strict;
use warnings;

use Test::More;

our $sql_script = $ENV{IDEM_SQL_SCRIPT};

# The predicate "the row of pg_class / pg_proc under $alias is one of
# pg_idem's": a member of the extension, or of the SQL edition's schema
# (its internal functions apart).
sub installed
{
	my ($catalog, $alias) = @_;
	if ($sql_script)
	{
		return $catalog eq 'pg_class'
		  ? "$alias.relnamespace OPERATOR(pg_catalog.=) 'idem'::pg_catalog.regnamespace::pg_catalog.oid"
		  : "$alias.pronamespace OPERATOR(pg_catalog.=) 'idem'::pg_catalog.regnamespace::pg_catalog.oid"
		  . " AND $alias.proname OPERATOR(pg_catalog.!~~) 'idem\\_\\_%'::pg_catalog.text";
	}
	# (The C edition's internal functions, idem__* since 0.6.0's redrive,
	# are attacked apart too.)
	return ($catalog eq 'pg_proc' ? "$alias.proname OPERATOR(pg_catalog.!~~) 'idem\\_\\_%'::pg_catalog.text AND " : '')
	  . "EXISTS (SELECT FROM pg_catalog.pg_depend d"
	  . " WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.$catalog'::pg_catalog.regclass"
	  . " AND d.objid OPERATOR(pg_catalog.=) $alias.oid"
	  . " AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass"
	  . " AND d.deptype OPERATOR(pg_catalog.=) 'e'"
	  . " AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e"
	  . " WHERE e.extname OPERATOR(pg_catalog.=) 'pg_idem'))";
}

# The catalog's list: every function of the extension but the triggers.
our $functions_view = qq{
CREATE VIEW intruder.functions AS
SELECT p.oid, p.oid::pg_catalog.regprocedure::pg_catalog.text AS sig, p.prokind
  FROM pg_catalog.pg_proc p
 WHERE @{[ installed('pg_proc', 'p') ]}
   AND p.prorettype OPERATOR(pg_catalog.<>) 'pg_catalog.trigger'::pg_catalog.regtype;
CREATE VIEW intruder.trigger_functions AS
SELECT p.oid, p.oid::pg_catalog.regprocedure::pg_catalog.text AS sig
  FROM pg_catalog.pg_proc p
 WHERE @{[ installed('pg_proc', 'p') ]}
   AND p.prorettype OPERATOR(pg_catalog.=) 'pg_catalog.trigger'::pg_catalog.regtype;
};

# The attacker's schema: targets, defaults, the call builder, the attack
# and the plants that maintenance runs.  Everything is schema-qualified:
# maintenance may run it with any search_path.
our $plant = $functions_view . q{
-- What the attacker knows of each victim: one row per parameter name.
CREATE TABLE intruder.targets (victim text, set text, side text, pname text, val text);
-- A value for the other parameters: by name and type, else by type.
CREATE TABLE intruder.defaults (pname text, ptype pg_catalog.regtype, val text);
-- What every call answered.
CREATE TABLE intruder.log (
	ctx text, victim text, set text, fn text,
	victim_out text, ghost_out text, victim_raw text, ghost_raw text,
	cur pg_catalog.name DEFAULT current_user, sess pg_catalog.name DEFAULT session_user);
-- Set by the superuser around its maintenance: what the plants then do.
CREATE TABLE intruder.armed (ctx text);

-- The SQL of one call of function fn, with the values of (victim, set, side).
CREATE FUNCTION intruder.call_sql(fn pg_catalog.oid, v text, s text, sd text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
	p record;
	args text := '';
	val text;
	found_val boolean;
	kind "char";
BEGIN
	FOR p IN
		SELECT coalesce(u.n, '') AS pname, u.t::pg_catalog.regtype AS ptype, u.o
		  FROM pg_catalog.pg_proc pr,
		       unnest(coalesce(pr.proargnames, pg_catalog.array_fill(''::text, ARRAY[pg_catalog.cardinality(coalesce(pr.proallargtypes, pr.proargtypes::pg_catalog.oid[]))])),
		              coalesce(pr.proallargtypes, pr.proargtypes::pg_catalog.oid[]),
		              coalesce(pr.proargmodes, pg_catalog.array_fill('i'::"char", ARRAY[pg_catalog.cardinality(pr.proargtypes::pg_catalog.oid[])])))
		         WITH ORDINALITY AS u(n, t, m, o)
		 WHERE pr.oid = fn AND u.m IN ('i', 'b', 'v')
		 ORDER BY u.o
	LOOP
		SELECT t.val, true INTO val, found_val FROM intruder.targets t
		 WHERE t.victim = v AND t.set = s AND t.side = sd AND t.pname = p.pname;
		IF found_val IS NULL THEN
			SELECT d.val, true INTO val, found_val FROM intruder.defaults d
			 WHERE d.pname = p.pname AND d.ptype = p.ptype;
		END IF;
		IF found_val IS NULL THEN
			SELECT d.val, true INTO val, found_val FROM intruder.defaults d
			 WHERE d.pname IS NULL AND d.ptype = p.ptype;
		END IF;
		IF found_val IS NULL THEN
			-- The suite has to learn this type: a check fails on HR001.
			RAISE EXCEPTION 'no value for parameter % of type %', p.pname, p.ptype
				USING ERRCODE = 'HR001';
		END IF;
		args := args || CASE WHEN args = '' THEN '' ELSE ', ' END
			|| coalesce(pg_catalog.quote_literal(val), 'NULL') || '::' || pg_catalog.format_type(p.ptype, NULL);
		found_val := NULL;
	END LOOP;
	SELECT pr.prokind INTO kind FROM pg_catalog.pg_proc pr WHERE pr.oid = fn;
	IF kind = 'p' THEN
		RETURN pg_catalog.format('CALL %s.%I(%s)',
			(SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_proc pr
			   JOIN pg_catalog.pg_namespace n ON n.oid = pr.pronamespace WHERE pr.oid = fn),
			(SELECT pr.proname FROM pg_catalog.pg_proc pr WHERE pr.oid = fn), args);
	END IF;
	RETURN pg_catalog.format('SELECT pg_catalog.string_agg(r::text, %L) FROM %s.%I(%s) AS r', ';',
		(SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_proc pr
		   JOIN pg_catalog.pg_namespace n ON n.oid = pr.pronamespace WHERE pr.oid = fn),
		(SELECT pr.proname FROM pg_catalog.pg_proc pr WHERE pr.oid = fn), args);
END $$;

-- Run one call; keep its effects only when asked and when the transaction
-- could commit with them.  The answer: "ok <result>" or "error <sqlstate>
-- <message> / <detail>".
CREATE FUNCTION intruder.try_call(sql text, keep boolean) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	r text;
	res text;
	ran boolean := false;
	st text;
	msg text;
	det text;
BEGIN
	BEGIN
		IF sql LIKE 'CALL %' THEN
			EXECUTE sql;
		ELSE
			EXECUTE sql INTO r;
		END IF;
		res := 'ok ' || coalesce(r, '<null>');
		ran := true;
		BEGIN
			SET CONSTRAINTS ALL IMMEDIATE;
			RAISE EXCEPTION 'probe' USING ERRCODE = 'HR000';
		EXCEPTION WHEN SQLSTATE 'HR000' THEN
			NULL;
		END;
		IF NOT keep THEN
			RAISE EXCEPTION 'rollback' USING ERRCODE = 'HR000';
		END IF;
	EXCEPTION WHEN SQLSTATE 'HR000' THEN
		NULL;
	WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
		res := CASE WHEN ran THEN res || ' then at commit: ' ELSE '' END
			|| 'error ' || st || ' ' || msg || coalesce(' / ' || nullif(det, ''), '');
	END;
	RETURN res;
END $$;

-- An answer without what differs between the victim's and the ghost's
-- identifiers: their values (by parameter name), then uuids, times,
-- intervals, bytea and ids of 6 digits or more (the outbox's and the
-- generations, which start at 100000).
CREATE FUNCTION intruder.norm(answer text, v text, s text, sd text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
	t record;
	a text := answer;
BEGIN
	FOR t IN SELECT pname, val FROM intruder.targets
	          WHERE victim = v AND set = s AND side = sd AND pg_catalog.length(val) >= 3
	          ORDER BY pg_catalog.length(val) DESC
	LOOP
		a := pg_catalog.replace(a, t.val, '<' || t.pname || '>');
		-- in a message, a value may be quoted
		a := pg_catalog.replace(a, pg_catalog.quote_literal(t.val), '<' || t.pname || '>');
	END LOOP;
	a := pg_catalog.regexp_replace(a, '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'g');
	a := pg_catalog.regexp_replace(a, '\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:\d\d)?)?', '<time>', 'g');
	-- a remaining lease or cooldown depends on when the call ran
	a := pg_catalog.regexp_replace(a, '\m\d+:\d\d:\d\d(\.\d+)?', '<interval>', 'g');
	a := pg_catalog.regexp_replace(a, '\\\\?x[0-9a-f]+', '<bytea>', 'g');
	a := pg_catalog.regexp_replace(a, '\m\d{6,}\M', '<id>', 'g');
	RETURN a;
END $$;

-- Every function against every target set (or one), ghost then victim.
CREATE FUNCTION intruder.attack(ctx text, only_set text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
	f record;
	t record;
	g text;
	vr text;
	sql_g text;
	sql_v text;
	n integer := 0;
BEGIN
	FOR t IN SELECT DISTINCT victim, set FROM intruder.targets
	          WHERE only_set IS NULL OR set = only_set ORDER BY 1, 2
	LOOP
		FOR f IN SELECT oid, sig FROM intruder.functions ORDER BY sig LOOP
			BEGIN
				sql_g := intruder.call_sql(f.oid, t.victim, t.set, 'ghost');
				sql_v := intruder.call_sql(f.oid, t.victim, t.set, 'victim');
				IF sql_g = sql_v THEN
					-- no identifier among the arguments: nothing to compare
					vr := intruder.try_call(sql_v, true);
					g := vr;
				ELSE
					g := intruder.try_call(sql_g, true);
					vr := intruder.try_call(sql_v, true);
				END IF;
			EXCEPTION WHEN SQLSTATE 'HR001' THEN
				g := 'error HR001 ' || SQLERRM;
				vr := g;
			END;
			INSERT INTO intruder.log (ctx, victim, set, fn, victim_out, ghost_out, victim_raw, ghost_raw)
			VALUES (ctx, t.victim, t.set, f.sig,
			        intruder.norm(vr, t.victim, t.set, 'victim'),
			        intruder.norm(g, t.victim, t.set, CASE WHEN sql_g = sql_v THEN 'victim' ELSE 'ghost' END),
			        vr, g);
			n := n + 1;
		END LOOP;
	END LOOP;
	RETURN n;
END $$;

-- The same, as the attacker whoever calls it.
CREATE FUNCTION intruder.attack_as_definer(ctx text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	SELECT intruder.attack(ctx)
$$;

-- The same with idem.scope naming a victim: a definer may set it for the
-- call; it must be the definer's privileges that count, not the caller's.
CREATE FUNCTION intruder.attack_as_definer_in_app_scope(ctx text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET idem.scope = 'app' AS $$
	SELECT intruder.attack(ctx)
$$;

-- An index expression (and a materialized view): attacks when armed.
CREATE FUNCTION intruder.plant_expr(x integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
	c text;
BEGIN
	SELECT a.ctx INTO c FROM intruder.armed a LIMIT 1;
	IF c IS NOT NULL THEN
		PERFORM intruder.attack(c);
	END IF;
	RETURN x;
END $$;

CREATE TABLE intruder.plant (x integer PRIMARY KEY) WITH (autovacuum_enabled = false);
CREATE INDEX plant_expr ON intruder.plant ((intruder.plant_expr(x)));
INSERT INTO intruder.plant VALUES (1);
CREATE TABLE intruder.plant_av (x integer PRIMARY KEY) WITH (autovacuum_enabled = false);
CREATE INDEX plant_av_expr ON intruder.plant_av ((intruder.plant_expr(x)));
INSERT INTO intruder.plant_av VALUES (1);
CREATE MATERIALIZED VIEW intruder.mv AS SELECT intruder.plant_expr(1) AS x WITH NO DATA;
CREATE UNIQUE INDEX mv_x ON intruder.mv (x);

-- A row-level trigger on the child of another role's table: an FK
-- cascade runs it as the child's owner, in the deleting role's session.
CREATE FUNCTION intruder.cascade_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM intruder.attack(CASE TG_WHEN WHEN 'BEFORE' THEN 'fk-cascade' ELSE 'fk-cascade-after' END);
	RETURN OLD;
END $$;
};

# The defaults of the parameters no target set names.
# Without the library, idem.scope is a placeholder, which PostgreSQL 15
# lets only a superuser put in a function's SET clause: the SQL edition's
# definer sets it in its body instead (until the end of the transaction).
$plant =~ s/ SET idem\.scope = 'app' AS \$\$\n/ AS \$\$\n\tSELECT pg_catalog.set_config('idem.scope', 'app', true);\n/
  or die 'the plant of idem.scope changed'
  if $sql_script;

our $defaults = q{
INSERT INTO intruder.defaults (pname, ptype, val) VALUES
	('principal', 'text', 'user:1'), ('method', 'text', 'POST'), ('key', 'text', 'k1'),
	('body', 'bytea', 'hostile body'), ('lease', 'interval', '50 minutes'), ('max_wait', 'interval', NULL),
	('status', 'integer', '200'), ('headers', 'jsonb', '{}'), ('strict', 'boolean', 'false'),
	('cooldown', 'interval', '1 hour'), ('batch', 'integer', '10'), ('topic', 'text', 'hostile'),
	('payload', 'jsonb', '{"x": 1}'), ('payload', 'bytea', 'x'), ('payloads', 'jsonb[]', '{"{}"}'),
	('keys', 'text[]', NULL), ('headers', 'jsonb[]', NULL), ('delay', 'interval', '0'),
	('error', 'text', 'boom'), ('older_than', 'interval', '0'), ('timeout', 'interval', '10 milliseconds'),
	('max_attempts', 'integer', '1'), ('name', 'text', 'x.pdf'), ('key_prefix', 'text', 'hs'),
	('reason', 'text', 'reaped_no_blob'), ('event_payload', 'jsonb', NULL), ('event_topic', 'text', NULL),
	('mode', 'text', 'replace'), ('created_by', 'text', 'intruder'), ('object_name', 'text', 'o.pdf'),
	('declared_digest', 'bytea', NULL), ('grace', 'interval', '0'), ('retention', 'interval', '0'),
	('dead_since', 'timestamptz', NULL), ('dead_before', 'timestamptz', NULL), ('all_dead', 'boolean', 'false'),
	(NULL, 'text', 'x'), (NULL, 'bytea', '\x00'), (NULL, 'integer', '1'), (NULL, 'bigint', '1'),
	(NULL, 'smallint', '1'), (NULL, 'interval', '0'), (NULL, 'jsonb', '{}'), (NULL, 'boolean', 'false'),
	(NULL, 'uuid', '00000000-0000-4000-8000-000000000000'), (NULL, 'timestamptz', '2000-01-01'),
	(NULL, 'text[]', NULL), (NULL, 'bigint[]', '{1}'), (NULL, 'jsonb[]', NULL), (NULL, 'name', 'x'),
	(NULL, 'oid', '0'), (NULL, 'regrole', 'intruder');
};

# The judge: snapshots of every table of the extension, and their diff.
our $judge = q{
CREATE SCHEMA judge;
CREATE TABLE judge.snap (phase text, tbl text, line text, scope text);
-- The victims' identifiers, written by each victim at set-up.
CREATE TABLE judge.victims (victim text, set text, pname text, val text);
GRANT USAGE ON SCHEMA judge TO PUBLIC;
GRANT INSERT ON judge.victims TO PUBLIC;

-- A row's scope: the scope column, whatever its type (a role's name or OID).
CREATE FUNCTION judge.take(ph text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	r record;
BEGIN
	FOR r IN
		SELECT c.oid::regclass AS rel
		  FROM pg_class c
		 WHERE } . installed('pg_class', 'c') . q{
		   AND c.relkind IN ('r', 'p')
	LOOP
		EXECUTE format('INSERT INTO judge.snap SELECT %L, %L, t::text, to_jsonb(t)->>''scope'' FROM %s t',
		               ph, r.rel, r.rel);
	END LOOP;
	RETURN (SELECT count(*) FROM judge.snap WHERE phase = ph);
END $$;

-- The rows of another scope than the allowed roles' that changed between
-- two snapshots.
CREATE FUNCTION judge.diff(before text, after text, allowed name[]) RETURNS SETOF text
LANGUAGE sql AS $$
	WITH ok AS (
		SELECT rolname::text AS s FROM pg_roles WHERE rolname = ANY (allowed)
		UNION SELECT oid::text FROM pg_roles WHERE rolname = ANY (allowed)),
	b AS (SELECT tbl, line, scope FROM judge.snap WHERE phase = before
	      EXCEPT ALL SELECT tbl, line, scope FROM judge.snap WHERE phase = after),
	a AS (SELECT tbl, line, scope FROM judge.snap WHERE phase = after
	      EXCEPT ALL SELECT tbl, line, scope FROM judge.snap WHERE phase = before)
	SELECT 'changed or gone: ' || tbl || ' ' || line FROM b WHERE coalesce(scope, '<none>') NOT IN (SELECT s FROM ok)
	UNION ALL
	SELECT 'appeared: ' || tbl || ' ' || line FROM a WHERE coalesce(scope, '<none>') NOT IN (SELECT s FROM ok)
	ORDER BY 1
$$;
};

# A victim's rows, made by the victim itself (psql variable :V is its
# name): in each module an object of each interesting state.
#   done:   a completed key, a done message, a claimed event (token T1), a pending attempt
#   open:   a pending key, a failed message (retries left), a pending event, a stored attempt
#   failed: a failed key, a dead message, an archived event, a failed attempt
our $victim_setup = q{
DO $$
DECLARE
	v text := current_user;
	h bytea := pg_catalog.sha256('body-1'::bytea);
	d bytea := pg_catalog.sha256('blob'::bytea);
	c text := 'orders-' || current_user;
	k1 bytea := idem.idem_key('user:' || current_user, 'POST', '/pay', 'done');
	k2 bytea := idem.idem_key('user:' || current_user, 'POST', '/pay', 'open');
	k3 bytea := idem.idem_key('user:' || current_user, 'POST', '/pay', 'failed');
	c1 uuid; c2 uuid; c3 uuid;
	t1 uuid; t3 uuid; e1 bigint; e2 bigint; e3 bigint;
	a1 uuid; a2 uuid; a3 uuid;
	intent jsonb := '{"n": 1}';
BEGIN
	-- Every response body and payload carries "secret-of-<victim>": no
	-- answer to another role may.
	-- first: dead messages and failed attempts stage events too
	e1 := idem.idem_outbox_stage('orders', jsonb_build_object('n', 1, 'secret', 'secret-of-' || v));
	SELECT claim_token, id INTO t1, e1 FROM idem.idem_outbox_claim(1, '1 hour'::interval);
	e3 := idem.idem_outbox_stage('orders', jsonb_build_object('n', 3, 'secret', 'secret-of-' || v));
	SELECT claim_token, id INTO t3, e3 FROM idem.idem_outbox_claim(1, '1 hour'::interval);
	PERFORM idem.idem_outbox_ack(t3, ARRAY[e3]);
	e2 := idem.idem_outbox_stage('orders', jsonb_build_object('n', 2, 'secret', 'secret-of-' || v));

	SELECT claim_id INTO c1 FROM idem.idem_claim(k1, h, '1 hour'::interval);
	PERFORM idem.idem_finalize(k1, c1, 200, '{"x": "y"}'::jsonb, convert_to('secret-of-' || v, 'UTF8'));
	SELECT claim_id INTO c2 FROM idem.idem_claim(k2, h, '1 hour'::interval);
	SELECT claim_id INTO c3 FROM idem.idem_claim(k3, h, '1 hour'::interval);
	PERFORM idem.idem_fail(k3, c3, '1 hour'::interval);

	PERFORM idem.idem_inbox_begin(c, 'msg-done', h, 3);
	PERFORM idem.idem_inbox_done(c, 'msg-done');
	PERFORM idem.idem_inbox_begin(c, 'msg-open', h, 3);
	BEGIN
		RAISE EXCEPTION 'the handler failed';
	EXCEPTION WHEN OTHERS THEN
		NULL;
	END;
	PERFORM idem.idem_inbox_fail(c, 'msg-open', 'handler failed');
	PERFORM idem.idem_inbox_begin(c, 'msg-failed', h, 1);
	BEGIN
		RAISE EXCEPTION 'the handler failed';
	EXCEPTION WHEN OTHERS THEN
		NULL;
	END;
	PERFORM idem.idem_inbox_fail(c, 'msg-failed', 'handler failed');


	SELECT attempt_id INTO a1 FROM idem.idem_attempt_open('upload', 'tgt-' || v || '-1', 'r1-' || v, v, intent, 'a.pdf', NULL);
	SELECT attempt_id INTO a2 FROM idem.idem_attempt_open('upload', 'tgt-' || v || '-2', 'r2-' || v, v, intent, 'b.pdf', NULL);
	PERFORM idem.idem_attempt_store(a2, 1, d);
	SELECT attempt_id INTO a3 FROM idem.idem_attempt_open('upload', 'tgt-' || v || '-3', 'r3-' || v, v, intent, 'c.pdf', NULL);
	PERFORM idem.idem_attempt_fail(a3, 1, 'reaped_no_blob', NULL);

	INSERT INTO judge.victims (victim, set, pname, val)
	SELECT v, s, p, x FROM (VALUES
		('done', 'cache_key', k1::text), ('done', 'claim_id', c1::text), ('done', 'message_id', 'msg-done'),
		('done', 'token', t1::text), ('done', 'id', e1::text), ('done', 'ids', ARRAY[e1]::text),
		('done', 'attempt_id', a1::text), ('done', 'target', 'tgt-' || v || '-1'), ('done', 'client_request_id', 'r1-' || v),
		('open', 'cache_key', k2::text), ('open', 'claim_id', c2::text), ('open', 'message_id', 'msg-open'),
		('open', 'token', t1::text), ('open', 'id', e2::text), ('open', 'ids', ARRAY[e2, e1]::text),
		('open', 'attempt_id', a2::text), ('open', 'target', 'tgt-' || v || '-2'), ('open', 'client_request_id', 'r2-' || v),
		('failed', 'cache_key', k3::text), ('failed', 'claim_id', c3::text), ('failed', 'message_id', 'msg-failed'),
		('failed', 'token', t3::text), ('failed', 'id', e3::text), ('failed', 'ids', ARRAY[e3]::text),
		('failed', 'attempt_id', a3::text), ('failed', 'target', 'tgt-' || v || '-3'), ('failed', 'client_request_id', 'r3-' || v)
	) AS x(s, p, x);
	-- The same in every set.
	INSERT INTO judge.victims (victim, set, pname, val)
	SELECT v, s, p, x FROM (VALUES ('done'), ('open'), ('failed')) AS sets(s),
	       (VALUES ('consumer', c), ('request_hash', h::text), ('payload_hash', h::text),
	               ('digest', d::text), ('generation', '1'), ('kind', 'upload'), ('intent', intent::text)) AS y(p, x);
END $$;
};

# The ghosts of a target set: the same parameters, identifiers nobody
# has, written to the attacker's targets with the victim's.
sub targets_sql
{
	my ($set) = @_;
	return qq{
INSERT INTO intruder.targets (victim, set, side, pname, val)
SELECT victim, set, 'victim', pname, val FROM judge.victims WHERE set = '$set';
INSERT INTO intruder.targets (victim, set, side, pname, val)
SELECT victim, set, 'ghost', pname,
       CASE pname
         WHEN 'cache_key' THEN idem.idem_key('ghost:' || victim, 'POST', '/pay', set)::text
         WHEN 'claim_id' THEN gen_random_uuid()::text
         WHEN 'token' THEN gen_random_uuid()::text
         WHEN 'attempt_id' THEN gen_random_uuid()::text
         WHEN 'message_id' THEN 'ghost-' || val
         WHEN 'consumer' THEN 'ghost-' || val
         WHEN 'target' THEN 'ghost-' || val
         WHEN 'client_request_id' THEN 'ghost-' || val
         WHEN 'id' THEN (900000000 + val::bigint)::text
         WHEN 'ids' THEN (SELECT array_agg(900000000 + e)::text FROM unnest(val::bigint[]) AS e)
         ELSE val END
  FROM judge.victims WHERE set = '$set';
};
}

# The advisory lock id a message of the consumer maps to in 0.4.0 (the
# first 8 bytes of its key, read as a little-endian int64): computable by
# anyone from the consumer and message id, with pg_catalog's functions.
sub message_lock_id_sql
{
	my ($consumer, $message) = @_;
	return qq{
SELECT ('x' || string_agg(lpad(to_hex(get_byte(d, 7 - i)), 2, '0'), '' ORDER BY i))::bit(64)::bigint
  FROM (SELECT sha256('pg_idem inbox v1'::bytea
                      || int4send(octet_length(convert_to('$consumer', 'UTF8'))) || convert_to('$consumer', 'UTF8')
                      || int4send(octet_length(convert_to('$message', 'UTF8'))) || convert_to('$message', 'UTF8')) AS d) s,
       generate_series(0, 7) AS i};
}

# Send a statement to a background psql without waiting for it.
sub send_query
{
	my ($s, $sql) = @_;
	$s->{stdout} = '';
	$s->{stderr} = '';
	$s->{stdin} .= "$sql\n\\echo 'hostile: done'\n";
	$s->{run}->pump_nb;
}

sub query_done
{
	my ($s) = @_;
	$s->{run}->pump_nb;
	return $s->{stdout} =~ /hostile: done/;
}

# Wait (a generous deadline) for the answer of send_query.
sub wait_query
{
	my ($s) = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	until (query_done($s))
	{
		return undef if time > $deadline;
		$s->{run}->pump_nb;
		select(undef, undef, undef, 0.05);
	}
	(my $out = $s->{stdout}) =~ s/\n?hostile: done\n?//;
	return $out;
}

# The advisory-lock attacks on the inbox.
sub advisory_attacks
{
	my ($node, $lock_timeout, $no_hold) = @_;
	my $h = q{sha256('body-1'::bytea)};

	# 1. A role with no grant takes the lock id of app's next message.
	my $o = $node->background_psql('postgres', extra_params => [ '-U', 'outsider' ]);
	my $id = $o->query_safe(message_lock_id_sql('orders-app', 'm-adv'));
	$o->query_safe("SELECT pg_advisory_lock($id)");
	my ($out, $err) = ('', '');
	$node->psql('postgres', qq{$lock_timeout
		BEGIN;
		SELECT idem.idem_inbox_begin('orders-app', 'm-adv', $h, 3);
		SELECT idem.idem_inbox_done('orders-app', 'm-adv');
		COMMIT;}, stdout => \$out, stderr => \$err, extra_params => [ '-U', 'app' ]);
	is("$out$err", "process\n", 'advisory: a role with no grant holding the message\'s advisory lock id does not make app wait');
	$o->query_safe('SELECT pg_advisory_unlock_all()');

	# 2. While app's attempt is open, other roles cannot see or take it.
	my $a = $node->background_psql('postgres', extra_params => [ '-U', 'app' ]);
	$a->query_safe('BEGIN');
	is($a->query_safe(qq{SELECT idem.idem_inbox_begin('orders-app', 'm-seen', $h, 3)}), 'process',
		'advisory: app\'s attempt is open');
	my $apid = $a->query_safe('SELECT pg_backend_pid()');
	is($o->query_safe("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $apid"), '0',
		'advisory: pg_locks shows no advisory lock of app\'s open attempt');
	$id = $o->query_safe(message_lock_id_sql('orders-app', 'm-seen'));
	is($o->query_safe("SELECT pg_try_advisory_lock($id)"), 't',
		'advisory: the message\'s lock id is free for anyone to take (no oracle, nothing held)');
	$o->query_safe('SELECT pg_advisory_unlock_all()');
	$a->query_safe(q{SELECT idem.idem_inbox_done('orders-app', 'm-seen'); COMMIT});
	$a->quit;
	$o->quit;

	# (The SQL edition holds no advisory lock, and does not count an
	# attempt rolled back without its recording: nothing to release.)
	return if $no_hold;

	# 3. After a failed max_attempts = 1 attempt, app's own session releases
	# its hold on the message with ordinary SQL; a second delivery must not
	# be told "process" (the handler would run twice).
	$node->safe_psql('postgres', q{
		CREATE VIEW app.unlock_all AS SELECT pg_advisory_unlock_all()::text AS u;
		CREATE FUNCTION app.unlock_all_fn() RETURNS void LANGUAGE sql AS 'SELECT pg_advisory_unlock_all()';
		ALTER VIEW app.unlock_all OWNER TO app;
		ALTER FUNCTION app.unlock_all_fn() OWNER TO app;
	});
	my @release = (
		[ 'view', undef, 'SELECT * FROM app.unlock_all' ],
		[ 'sql-function', undef, 'SELECT app.unlock_all_fn()' ],
		[ 'prepared', 'PREPARE unlock AS SELECT pg_advisory_unlock_all()', 'EXECUTE unlock' ],
		[ 'plpgsql', undef, 'DO $$BEGIN PERFORM pg_advisory_unlock_all(); END$$' ],
		[ 'unlock-by-id', undef,
		  q{SELECT pg_advisory_unlock(((classid::bigint << 32) | objid::bigint))
		      FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid()} ],
		[ 'unlock-computed', undef, 'SELECT pg_advisory_unlock((' . message_lock_id_sql('orders-app', 'm-unlock-unlock-computed') . '))' ]);
	for my $r (@release)
	{
		my ($how, $prepare, $sql) = @$r;
		my $m = "m-unlock-$how";
		my $s1 = $node->background_psql('postgres', on_error_stop => 0, extra_params => [ '-U', 'app' ]);
		$s1->query_safe($prepare) if $prepare;
		$s1->query_safe('BEGIN');
		my $first = $s1->query_safe(qq{SELECT idem.idem_inbox_begin('orders-app', '$m', $h, 1)});
		$s1->query_safe('ROLLBACK');    # the handler failed
		$s1->query($sql);
		note("$how: $s1->{stderr}") if $s1->{stderr} ne '';
		$s1->{stderr} = '';

		my $s2 = $node->background_psql('postgres', on_error_stop => 0, extra_params => [ '-U', 'app' ]);
		my $pid2 = $s2->query_safe('SELECT pg_backend_pid()');
		send_query($s2, qq{BEGIN; SELECT idem.idem_inbox_begin('orders-app', '$m', $h, 1); ROLLBACK;});
		# The second delivery answers at once or waits for the first's
		# session: either way, once the first session has ended it must
		# say the message is dead.
		my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
		until (query_done($s2) || time > $deadline
			|| $node->safe_psql('postgres', qq{
				SELECT count(*) FROM pg_stat_activity WHERE pid = $pid2 AND state = 'active'
				   AND wait_event_type IS NOT NULL AND wait_event_type <> 'Client'}) eq '1')
		{
			select(undef, undef, undef, 0.05);
		}
		my $early = query_done($s2) ? 'answered before the first session ended' : 'waited for the first session';
		$s1->quit;
		my $second = wait_query($s2);
		$s2->quit;
		is("$first, then $second", 'process, then dead',
			"advisory ($how): a failed max_attempts = 1 message is not handed out again ($early)");
	}
}

1;
