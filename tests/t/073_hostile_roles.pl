# Hostile roles (issue 24): whatever SQL a role can write, it reaches no
# other role's keys, inbox messages, outbox events or attempts, blocks no
# other role's work, and learns nothing of them beyond what
# docs/guides/privileges.md's isolation table says.
#
# The victims are an idem_client role (app) and the superuser, each with
# keys, messages, events and attempts in every interesting state.  The
# attackers: a second idem_client role (intruder) calling every function
# of the extension (derived from pg_depend: see HostileRoles.pm) with the
# victims' identifiers and secrets (claim ids, claim tokens, attempt ids);
# a role without any pg_idem privilege (outsider) doing the same; and the
# intruder's code run by others:
#   - a SECURITY DEFINER function the victims call (it acts as the intruder);
#   - a SECURITY DEFINER function of the intruder's with idem.scope = 'app'
#     in its SET clause, called by app, and the same SET in a session;
#   - a row trigger on the intruder's child table of app's table, run by
#     app's DELETE through the ON DELETE CASCADE (BEFORE: as the child's
#     owner; AFTER: as app, whose privileges PostgreSQL gives it);
#   - an index expression and a materialized view of the intruder's that
#     the superuser's maintenance evaluates (REINDEX [CONCURRENTLY], ANALYZE,
#     CLUSTER, VACUUM FULL, CREATE INDEX, REFRESH MATERIALIZED VIEW
#     [CONCURRENTLY]) and autovacuum's ANALYZE;
#   - a new role created under the name of a renamed one.
# Every table of the extension is compared before and after each attack:
# no row outside the attacker's own scope may change, appear or go.  Every
# call is made with the victim's identifiers and with identifiers nobody
# has: the answers must be the same, and none may carry another role's
# response bodies or payloads.  No client role or role without grants
# has any privilege on the extension's relations; an idem_admin role
# reads every scope's rows.  Then the blocking: one role's open
# transaction (an inbox attempt, a claim, an attempt, a claimed event) may
# not make another role's calls wait, and neither may a role with no
# grant taking the advisory lock a message's id maps to; and no role may
# release the inbox cap's hold with pg_advisory_unlock_all() or
# pg_advisory_unlock() from a view, a SQL function or a prepared plan.
#
# A wait is detected with a generous lock_timeout (10 s): it is a failure,
# never an expected answer.
#
# With IDEM_SQL_SCRIPT (tests/suites/66_sql_edition.sh), the same attacks
# on the SQL edition's plain script (HostileRoles.pm), on a server without
# pg_idem's library; and its internal functions, which idem_client may
# call, called directly with another role named as the caller.  The inbox
# cap's hold is no advisory lock there, and an attempt rolled back without
# its recording is not counted (docs/guides/managed-postgresql.md): the
# attacks that release a hold are the C edition's only.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use HostileRoles;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $LOCK_TIMEOUT = "SET lock_timeout = '10s';";

my $sql_script = $HostileRoles::sql_script;
my $node = PostgreSQL::Test::Cluster->new('hostile_roles');
$node->init;
$node->append_conf('postgresql.conf', ($sql_script ? '' : q{
shared_preload_libraries = 'pg_idem'
idem.cleanup_interval = '1d'
}) . q{
autovacuum_naptime = 1
log_min_messages = warning
});
$node->start;
my $su = $node->safe_psql('postgres', 'SELECT current_user');
my $installed_rel = HostileRoles::installed('pg_class', 'c');

sub as
{
	my ($role, $sql) = @_;
	return $node->safe_psql('postgres', $sql, extra_params => [ '-U', $role ]);
}

# Run SQL as a role; its stdout, and stderr when it failed.
sub try_as
{
	my ($role, $sql) = @_;
	my ($out, $err) = ('', '');
	my $rc = $node->psql('postgres', $sql, stdout => \$out, stderr => \$err,
		on_error_stop => 1, extra_params => [ '-U', $role ]);
	return ($rc, $out, $err);
}

# --- The extension, the roles, the victims' rows.
$node->safe_psql('postgres', $sql_script ? "\\set schema idem\n\\i $sql_script\n"
	: 'CREATE SCHEMA idem; CREATE EXTENSION pg_idem SCHEMA idem;');
$node->safe_psql('postgres', qq{
	-- as if installed into public: every role may look up its functions
	GRANT USAGE ON SCHEMA idem TO PUBLIC;
	CREATE ROLE app LOGIN;
	CREATE ROLE intruder LOGIN;
	CREATE ROLE outsider LOGIN;
	GRANT idem_client TO app, intruder;
	CREATE SCHEMA app AUTHORIZATION app;
	CREATE SCHEMA intruder AUTHORIZATION intruder;
	CREATE ROLE ops LOGIN;
	GRANT idem_admin TO ops;
	-- ids and generations of 6 digits, which the answers' comparison ignores
	SELECT setval(c.oid::regclass, 100000)
	  FROM pg_class c WHERE $installed_rel AND c.relkind = 'S';
	SELECT idem.idem_attempt_register_kind('upload', 'replace', 'hs');
	$HostileRoles::judge
});
as($_, $HostileRoles::victim_setup) for ('app', $su);
as('intruder', $HostileRoles::plant . $HostileRoles::defaults);
$node->safe_psql('postgres', HostileRoles::targets_sql($_)) for qw(done open failed);
as('intruder', q{
	GRANT USAGE ON SCHEMA intruder TO PUBLIC;
	GRANT SELECT ON ALL TABLES IN SCHEMA intruder TO PUBLIC;
	GRANT INSERT ON intruder.log TO PUBLIC;
});

my @functions = split /\n/, as('intruder', 'SELECT sig FROM intruder.functions ORDER BY 1');
my $sets = $node->safe_psql('postgres', 'SELECT count(DISTINCT (victim, set)) FROM intruder.targets');
cmp_ok(scalar(@functions), '>=', 40, 'the functions of the extension, from the catalog: ' . scalar(@functions));
is($sets, '6', 'two victims (app and the superuser), three target sets each');
note('functions attacked: ' . join(', ', @functions));

# --- The verdict of one attack context: run $attack (a code ref), with
# snapshots of every table around it.
my $phase = 0;

sub judged
{
	my ($ctx, $allowed, $attack, $trusted) = @_;
	my $before = 'p' . ++$phase;
	$node->safe_psql('postgres', "SELECT judge.take('$before')");
	my $ran = $attack->();
	my $after = 'p' . ++$phase;
	$node->safe_psql('postgres', "SELECT judge.take('$after')");
	ok($ran, "$ctx: the attack ran");
	verdict($ctx, $before, $after, $allowed, $trusted);
}

# $trusted: a victim whose privileges the attack legitimately has (its
# answers about that victim's objects are not compared).
sub verdict
{
	my ($ctx, $before, $after, $allowed, $trusted) = @_;
	my $others = defined $trusted ? "AND victim <> '$trusted'" : '';
	my $calls = $node->safe_psql('postgres', qq{
		SELECT count(DISTINCT (fn, victim, set)) = (SELECT count(*) FROM intruder.functions)
		       * (SELECT count(DISTINCT (victim, set)) FROM intruder.targets t
		           WHERE '$ctx' <> 'held-by-app' OR t.set = 'held')
		  FROM intruder.log WHERE ctx = '$ctx'});
	is($calls, 't', "$ctx: every function was called against every target set");
	if (defined $before)
	{
		my $roles = join(',', map { "'$_'" } @$allowed);
		is(limit($node->safe_psql('postgres',
					"SELECT * FROM judge.diff('$before', '$after', ARRAY[$roles]::name[])")),
			'', "$ctx: no row of another scope changed, appeared or went");
	}
	is(limit($node->safe_psql('postgres', qq{
		SELECT fn || ' on ' || victim || '/' || set || E':\n    victim''s: ' || victim_out
		       || E'\n    ghost''s:  ' || ghost_out
		  FROM intruder.log WHERE ctx = '$ctx' AND victim_out IS DISTINCT FROM ghost_out $others
		 ORDER BY fn, victim, set})),
		'', "$ctx: no answer tells whether another role's object exists");
	is(limit($node->safe_psql('postgres', qq{
		SELECT fn || ' on ' || victim || '/' || set || ': ' || victim_raw
		  FROM intruder.log WHERE ctx = '$ctx' AND (victim_raw ~ '^error (55P03|57014)' OR ghost_raw ~ '^error (55P03|57014)')
		 ORDER BY fn, victim, set})),
		'', "$ctx: no call waited for another role's lock");
	# Another role's data, as text or as bytea's hex.
	my @secrets = map { ("secret-of-$_", unpack('H*', "secret-of-$_")) }
	  grep { !defined $trusted || $_ ne $trusted } ('app', $su);
	my $pattern = join('|', @secrets);
	is(limit($node->safe_psql('postgres', qq{
		SELECT fn || ' on ' || victim || '/' || set || ': ' || victim_raw
		  FROM intruder.log WHERE ctx = '$ctx' AND (victim_raw ~ '$pattern' OR ghost_raw ~ '$pattern')
		 ORDER BY fn, victim, set})),
		'', "$ctx: no answer carries another role's response bodies or payloads");
}

# At most 40 lines of a list of findings.
sub limit
{
	my @l = split /\n/, $_[0];
	my $max = $ENV{HOSTILE_LINES} // 40;
	return $_[0] if @l <= $max;
	return join("\n", @l[ 0 .. $max - 1 ], '... and ' . (@l - $max) . ' more lines');
}

# --- A second idem_client role, directly.
judged('direct', ['intruder'], sub {
	my ($rc, $out, $err) = try_as('intruder', "$LOCK_TIMEOUT SELECT intruder.attack('direct')");
	diag($err) if $rc;
	return $rc == 0;
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM intruder.log WHERE victim_raw LIKE 'error HR001%'}),
	'0', 'every parameter of every function got a value');

# --- Dead letters (issue 33): each victim has a dead keyed event (made
# dead by hand) and a dead message (msg-failed); the intruder redrives by
# every filter and all_dead, with the victims' ids, topics, keys and
# consumers: nothing of theirs is redriven or reported, the stuck views
# and the audit are closed to it, and its own calls are audited in its
# own scope only.
for my $victim ('app', $su)
{
	$node->safe_psql('postgres', qq{
		SET ROLE "$victim";
		CREATE TEMP TABLE dead_id AS
			SELECT idem.idem_outbox_stage('orders', jsonb_build_object('secret', 'secret-of-$victim'), 'dead-key') AS id;
		RESET ROLE;
		UPDATE idem.idem_outbox_queue SET state = 'dead', dead_at = now(), attempts = 6 WHERE id = (SELECT id FROM dead_id);
		INSERT INTO judge.victims SELECT '$victim', 'dead', 'id', id::text FROM dead_id;
	});
}
{
	my $before = 'p' . ++$phase;
	$node->safe_psql('postgres', "SELECT judge.take('$before')");
	my $ids = $node->safe_psql('postgres', q{SELECT string_agg(val, ',') FROM judge.victims WHERE set = 'dead'});
	my ($rc, $out, $err) = try_as('intruder', qq{$LOCK_TIMEOUT
		SELECT 'outbox ' || r::text FROM unnest(ARRAY[$ids]::bigint[]) AS v(id), idem.idem_outbox_redrive(id => v.id) r
		UNION ALL SELECT 'outbox ' || r::text FROM idem.idem_outbox_redrive(topic => 'orders') r
		UNION ALL SELECT 'outbox ' || r::text FROM idem.idem_outbox_redrive(key => 'dead-key') r
		UNION ALL SELECT 'outbox ' || r::text FROM idem.idem_outbox_redrive(dead_before => now() + interval '1 day') r
		UNION ALL SELECT 'outbox ' || r::text FROM idem.idem_outbox_redrive(all_dead => true) r
		UNION ALL SELECT 'inbox ' || r::text FROM (VALUES ('app'), ('$su')) AS x(v), idem.idem_inbox_redrive('orders-' || x.v, 'msg-failed') r
		UNION ALL SELECT 'inbox ' || r::text FROM idem.idem_inbox_redrive(consumer => 'orders-app') r
		UNION ALL SELECT 'inbox ' || r::text FROM idem.idem_inbox_redrive(all_dead => true) r;
	});
	diag($err) if $rc;
	is($rc, 0, 'redrive: the intruder\'s calls ran');
	is($out, '', 'redrive: the intruder redrove and learned nothing of the victims');
	my $after = 'p' . ++$phase;
	$node->safe_psql('postgres', "SELECT judge.take('$after')");
	is(limit($node->safe_psql('postgres', "SELECT * FROM judge.diff('$before', '$after', ARRAY['intruder']::name[])")),
		'', 'redrive: no row of another scope changed, appeared or went');
}
is($node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT scope::text, ', ') FROM idem.idem_redrive_log}),
	'intruder', 'redrive: the intruder\'s calls are audited, all in its own scope (it may redrive its own dead events: on 18 the attack had left one)');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idem.idem_outbox_queue q JOIN judge.victims v ON v.set = 'dead' AND q.id = v.val::bigint
	 WHERE q.state = 'dead'}), '2', 'redrive: the victims\' events are still dead');

# --- A role with no pg_idem privilege: refused everything.
judged('outsider', ['outsider'], sub {
	my ($rc, $out, $err) = try_as('outsider', "$LOCK_TIMEOUT SELECT intruder.attack('outsider')");
	diag($err) if $rc;
	return $rc == 0;
});
is(limit($node->safe_psql('postgres', q{
	SELECT fn || ': ' || victim_raw FROM intruder.log
	 WHERE ctx = 'outsider' AND victim_raw NOT LIKE 'error 42501 %' ORDER BY 1})),
	'', 'outsider: every call is refused with 42501');

# --- The internal functions (idem__*, SECURITY DEFINER: the SQL
# edition's, and both editions' redrive since 0.6.0), which idem_client
# may call: called directly by the intruder with app or the superuser
# named as the caller, every one is refused by its caller domain
# (idem__caller, idem__redrive_caller: 23514) before it runs; and no role
# but the owner may keep a value of its types (a table's column: 42501).
{
	my $before = 'p' . ++$phase;
	$node->safe_psql('postgres', "SELECT judge.take('$before')");
	# The intruder's function that calls each with each victim named: run
	# by the intruder, and by each victim (a SECURITY DEFINER function of
	# the intruder's in the victim's session, the session's role being the
	# one named).
	as('intruder', qq{
		CREATE FUNCTION intruder.forge_internals() RETURNS text
		LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS \$\$
		DECLARE
			f record;
			v text;
			st text;
			n integer := 0;
			bad text := '';
		BEGIN
			FOR f IN
				SELECT p.oid::regproc::text AS fn, p.proargtypes[0]::regtype::text AS t
				  FROM pg_proc p JOIN pg_type ty ON ty.oid = p.proargtypes[0]
				 WHERE p.pronamespace = 'idem'::regnamespace AND p.proname LIKE 'idem\\_\\_%'
				   AND p.pronargs = 1
				   AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = ty.typrelid AND a.attname = 'caller')
			LOOP
				n := n + 1;
				FOREACH v IN ARRAY ARRAY['app', '$su'] LOOP
					BEGIN
						EXECUTE format('SELECT %s(jsonb_populate_record(NULL::%s, %L))::text',
									   f.fn, f.t, jsonb_build_object('caller', v));
						st := 'ran';
					EXCEPTION WHEN OTHERS THEN
						st := SQLSTATE;
					END;
					IF st <> '23514' THEN
						bad := bad || format(' %s as %s: %s', f.fn, v, st);
					END IF;
				END LOOP;
			END LOOP;
			RETURN n || CASE WHEN bad = '' THEN ' all refused' ELSE ':' || bad END;
		END
		\$\$;
		GRANT EXECUTE ON FUNCTION intruder.forge_internals() TO PUBLIC;
	});
	for my $who ('intruder', 'app', $su)
	{
		my ($rc, $out, $err) = try_as($who, "$LOCK_TIMEOUT SELECT intruder.forge_internals()");
		diag($err) if $rc;
		like($out, qr/^\d+ all refused$/,
			"internals: each called with another role as the caller, in $who\'s session, is refused: $out");
		cmp_ok(($out =~ /^(\d+)/)[0] // 0, '>=', $sql_script ? 20 : 2,
			'internals: the internal functions with a caller, from the catalog');
	}
	{
		for my $type (split /\n/, $node->safe_psql('postgres', q{
			SELECT t.oid::regtype FROM pg_type t
			 WHERE t.typnamespace = 'idem'::regnamespace AND t.typname LIKE 'idem\_\_%' AND t.typtype IN ('c', 'd')
			 ORDER BY 1}))
		{
			my ($trc, $tout, $terr) = try_as('intruder', "CREATE TABLE intruder.stash (v $type)");
			like($terr, qr/permission denied for type/, "internals: no table of the intruder's keeps a $type");
		}
	}
	my $after = 'p' . ++$phase;
	$node->safe_psql('postgres', "SELECT judge.take('$after')");
	is(limit($node->safe_psql('postgres', "SELECT * FROM judge.diff('$before', '$after', ARRAY['intruder']::name[])")),
		'', 'internals: no row of another scope changed, appeared or went');
}

# --- The extension's relations (pg_depend again): neither a client role
# nor a role without grants may read or write any of them.
for my $role ('intruder', 'outsider')
{
	my $open = $node->safe_psql('postgres', qq{
		SELECT string_agg(c.oid::regclass || ': ' || p, ', ' ORDER BY 1)
		  FROM pg_class c,
		       unnest(CASE WHEN c.relkind = 'S' THEN '{SELECT,UPDATE,USAGE}'::text[]
		                   ELSE '{SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER}'::text[] END) AS p
		 WHERE $installed_rel
		   AND CASE WHEN c.relkind = 'S' THEN has_sequence_privilege('$role', c.oid, p)
		            ELSE has_table_privilege('$role', c.oid, p) END});
	is($open, '', "$role has no privilege on any table, view or sequence of the extension");
}

# --- While every client role sees only its own rows, an idem_admin role
# reads every scope's: each table of the extension, counted as ops and as
# the superuser.
{
	my $counts = 'SELECT ' . join(" || ', ' || ", map { "'$_ ' || (SELECT count(*) FROM $_)" }
		  split /\n/, $node->safe_psql('postgres', qq{
			SELECT c.oid::regclass::text
			  FROM pg_class c WHERE $installed_rel AND c.relkind = 'r'
			 ORDER BY 1}));
	my ($rc, $out, $err) = try_as('ops', $counts);
	is($rc ? $err : $out, $node->safe_psql('postgres', $counts),
		'an idem_admin role reads every row of every table of the extension');
}

# --- The intruder's SECURITY DEFINER function, called by each victim.
for my $victim ('app', $su)
{
	my $ctx = $victim eq 'app' ? 'definer-app' : 'definer-su';
	judged($ctx, ['intruder'], sub {
		my ($rc, $out, $err) = try_as($victim, "$LOCK_TIMEOUT SELECT intruder.attack_as_definer('$ctx')");
		diag($err) if $rc;
		return $rc == 0;
	});
}

# --- idem.scope naming app: the intruder is no member of app, so it may
# not use app's scope, neither in its session nor in a definer's function
# that app calls.
judged('scope-setting', ['intruder'], sub {
	my ($rc, $out, $err) = try_as('intruder', "$LOCK_TIMEOUT SET idem.scope = 'app'; SELECT intruder.attack('scope-setting')");
	diag($err) if $rc;
	return $rc == 0;
});
judged('definer-scope-app', ['intruder'], sub {
	my ($rc, $out, $err) = try_as('app', "$LOCK_TIMEOUT SELECT intruder.attack_as_definer_in_app_scope('definer-scope-app')");
	diag($err) if $rc;
	return $rc == 0;
});

# --- An FK cascade: app deletes its own row, the cascade deletes the
# intruder's child row as the child's owner, and a BEFORE trigger of the
# intruder's runs in that query.
as('app', q{
	CREATE TABLE app.parent (id integer PRIMARY KEY);
	INSERT INTO app.parent VALUES (1), (2);
	GRANT USAGE ON SCHEMA app TO intruder;
	GRANT REFERENCES ON app.parent TO intruder;
});
as('intruder', q{
	CREATE TABLE intruder.child (pid integer REFERENCES app.parent ON DELETE CASCADE);
	INSERT INTO intruder.child VALUES (1);
	CREATE TRIGGER cascade_attack BEFORE DELETE ON intruder.child
		FOR EACH ROW EXECUTE FUNCTION intruder.cascade_trigger();
	CREATE TABLE intruder.child_after (pid integer REFERENCES app.parent ON DELETE CASCADE);
	INSERT INTO intruder.child_after VALUES (2);
	CREATE TRIGGER cascade_attack AFTER DELETE ON intruder.child_after
		FOR EACH ROW EXECUTE FUNCTION intruder.cascade_trigger();
});
judged('fk-cascade', ['intruder'], sub {
	my ($rc, $out, $err) = try_as('app', "$LOCK_TIMEOUT DELETE FROM app.parent WHERE id = 1");
	diag($err) if $rc;
	return $rc == 0;
});

# --- The superuser's maintenance runs the intruder's index expression
# and materialized view (as the intruder, in a security-restricted
# operation).
my @maintenance = (
	[ 'reindex', 'REINDEX TABLE intruder.plant' ],
	[ 'reindex-concurrently', 'REINDEX TABLE CONCURRENTLY intruder.plant' ],
	[ 'analyze', 'ANALYZE intruder.plant' ],
	[ 'cluster', 'CLUSTER intruder.plant USING plant_pkey' ],
	[ 'vacuum-full', 'VACUUM FULL intruder.plant' ],
	[ 'create-index', 'CREATE INDEX plant_expr_2 ON intruder.plant ((intruder.plant_expr(x) + 1))' ],
	[ 'refresh-mv', 'REFRESH MATERIALIZED VIEW intruder.mv' ],
	[ 'refresh-mv-concurrently', 'REFRESH MATERIALIZED VIEW CONCURRENTLY intruder.mv' ]);
for my $m (@maintenance)
{
	my ($ctx, $command) = @$m;
	judged($ctx, ['intruder'], sub {
		$node->safe_psql('postgres', "INSERT INTO intruder.armed VALUES ('$ctx')");
		my ($rc, $out, $err) = try_as($su, "$LOCK_TIMEOUT $command");
		$node->safe_psql('postgres', 'DELETE FROM intruder.armed');
		diag("$command: $err") if $rc;
		return $rc == 0;
	});
}

# --- Autovacuum's ANALYZE, with no human action: the plant's table gets
# autovacuum (it had none: it would have run the plant at any time) and
# changed rows; wait for the plant to have run (a generous deadline).
judged('autovacuum', ['intruder'], sub {
	$node->safe_psql('postgres', q{
		INSERT INTO intruder.armed VALUES ('autovacuum');
		ALTER TABLE intruder.plant_av SET (autovacuum_enabled = true,
			autovacuum_analyze_threshold = 0, autovacuum_analyze_scale_factor = 0);
	});
	as('intruder', 'UPDATE intruder.plant_av SET x = x');
	my $ran = $node->poll_query_until('postgres', qq{
		SELECT count(DISTINCT (fn, victim, set)) = ${\ (scalar(@functions) * $sets)}
		  FROM intruder.log WHERE ctx = 'autovacuum'});
	$node->safe_psql('postgres', q{
		ALTER TABLE intruder.plant_av SET (autovacuum_enabled = false);
		DELETE FROM intruder.armed;
	});
	# Autovacuum may still be inside its pass: wait for it to leave.
	$node->poll_query_until('postgres', q{
		SELECT count(*) = 0 FROM pg_stat_activity
		 WHERE backend_type = 'autovacuum worker' AND query LIKE '%plant_av%'});
	return $ran;
});

# --- The extension's trigger functions, on a table of the intruder's:
# refused, or (idem_version_guard) acting on that table only.
{
	my $before = 'p' . ++$phase;
	$node->safe_psql('postgres', "SELECT judge.take('$before')");
	my $ran = 1;
	for my $fn (split /\n/, as('intruder', 'SELECT sig FROM intruder.trigger_functions ORDER BY 1'))
	{
		my ($rc, $out, $err) = try_as('intruder', qq{
			CREATE TABLE intruder.trg_probe (id integer, version bigint NOT NULL DEFAULT 1,
				state text, scope text);
			CREATE TRIGGER probe BEFORE INSERT OR UPDATE ON intruder.trg_probe
				FOR EACH ROW EXECUTE FUNCTION $fn;
			INSERT INTO intruder.trg_probe VALUES (1, 1, 'pending', 'app');
			UPDATE intruder.trg_probe SET id = 2, version = 1;
		});
		my $granted = $node->safe_psql('postgres',
			"SELECT has_function_privilege('intruder', '$fn', 'EXECUTE')");
		note("$fn: " . ($rc ? $err : 'ran'));
		if ($granted eq 'f' && !($rc && $err =~ /permission denied for function/))
		{
			diag("$fn: not granted to idem_client, yet: " . ($rc ? $err : 'ran'));
			$ran = 0;
		}
		as('intruder', 'DROP TABLE IF EXISTS intruder.trg_probe');
	}
	ok($ran, 'triggers: each trigger function is refused unless granted to idem_client');
	my $after = 'p' . ++$phase;
	$node->safe_psql('postgres', "SELECT judge.take('$after')");
	is(limit($node->safe_psql('postgres', "SELECT * FROM judge.diff('$before', '$after', ARRAY['intruder']::name[])")),
		'', 'triggers: a granted trigger function on the intruder\'s table changes no row of the extension');
}

# --- Blocking 1: app's open transaction holds an in-transaction claim,
# an inbox attempt, an attempt and claimed events; the intruder attacks
# exactly those (target set "held", its ghosts those of "open").
{
	my $s = $node->background_psql('postgres', extra_params => [ '-U', 'app' ]);
	my $key = q{idem.idem_key('user:app', 'POST', '/pay', 'held')};
	$s->query_safe('BEGIN');
	my $claim = $s->query_safe("SELECT claim_id FROM idem.idem_begin($key, sha256('body-1'::bytea))");
	my $inbox = $s->query_safe(q{SELECT idem.idem_inbox_begin('orders-app', 'm-held', sha256('body-1'::bytea), 1)});
	my $attempt = $s->query_safe(q{SELECT attempt_id FROM idem.idem_attempt_open('upload', 'tgt-app-held',
		'r-held', 'app', '{"n": 1}', 'h.pdf', NULL)});
	my $event = $s->query_safe(q{SELECT idem.idem_outbox_stage('orders', '{"n": 5, "secret": "secret-of-app"}'::jsonb)});
	my ($token, $ids) = split /\|/, $s->query_safe(q{
		SELECT claim_token, array_agg(id) FROM idem.idem_outbox_claim(10, '1 hour') GROUP BY 1});
	is("$inbox " . ($claim ne '' && $attempt ne '' && $token ne '' ? 'held' : 'missing'), 'process held',
		'held-by-app: app holds a claim, an inbox attempt, an attempt and claimed events');
	$node->safe_psql('postgres', qq{
		INSERT INTO judge.victims (victim, set, pname, val)
		SELECT 'app', 'held', p, v FROM (VALUES ('cache_key', ${key}::text), ('claim_id', '$claim'),
			('message_id', 'm-held'), ('attempt_id', '$attempt'), ('target', 'tgt-app-held'),
			('client_request_id', 'r-held'), ('id', '$event'), ('token', '$token'), ('ids', '$ids')) AS x(p, v)
		UNION ALL
		SELECT 'app', 'held', pname, val FROM judge.victims
		 WHERE victim = 'app' AND set = 'open'
		   AND pname IN ('consumer', 'request_hash', 'payload_hash', 'digest', 'generation', 'kind', 'intent');
	} . HostileRoles::targets_sql('held'));
	my ($rc, $out, $err) = try_as('intruder', "$LOCK_TIMEOUT SELECT intruder.attack('held-by-app', 'held')");
	ok($rc == 0, 'held-by-app: the attack ran') or diag($err);
	# app finishes its work: nothing of the intruder's got in the way.
	$s->query("SELECT idem.idem_finalize($key, '$claim', 200, '{}', 'ok'::bytea);"
		  . " SELECT idem.idem_inbox_done('orders-app', 'm-held'); COMMIT");
	is($s->{stderr}, '', 'held-by-app: app\'s transaction commits as if nobody else were there');
	$s->quit;
	verdict('held-by-app');
}

# --- Blocking 2: the intruder's attack stays open in a transaction; app
# then does its own work on every one of its objects.
{
	my $s = $node->background_psql('postgres', extra_params => [ '-U', 'intruder' ]);
	$s->query_safe('BEGIN');
	$s->query_safe("SELECT intruder.attack('held-by-intruder')");
	my ($out, $err) = ("", "");
	my $rc = $node->psql("postgres", $LOCK_TIMEOUT . q{
		\set ON_ERROR_STOP 0
		SELECT outcome FROM idem.idem_claim(idem.idem_key('user:app', 'POST', '/pay', 'done'), sha256('body-1'::bytea));
		SELECT outcome FROM idem.idem_lookup(idem.idem_key('user:app', 'POST', '/pay', 'open'), sha256('body-1'::bytea));
		SELECT outcome FROM idem.idem_claim(idem.idem_key('user:app', 'POST', '/pay', 'failed'), sha256('body-1'::bytea));
		SELECT outcome FROM idem.idem_claim(idem.idem_key('user:app', 'POST', '/pay', 'new'), sha256('body-1'::bytea));
		BEGIN;
		SELECT idem.idem_inbox_begin('orders-app', 'msg-done', sha256('body-1'::bytea), 3);
		SELECT idem.idem_inbox_begin('orders-app', 'msg-open', sha256('body-1'::bytea), 3);
		SELECT idem.idem_inbox_done('orders-app', 'msg-open');
		SELECT idem.idem_inbox_begin('orders-app', 'msg-failed', sha256('body-1'::bytea), 3);
		SELECT idem.idem_inbox_begin('orders-app', 'm-new', sha256('body-1'::bytea), 3);
		SELECT idem.idem_inbox_done('orders-app', 'm-new');
		COMMIT;
		SELECT idem.idem_outbox_stage('orders', '{"n": 6, "secret": "secret-of-app"}'::jsonb) > 0;
		SELECT count(*) >= 0 FROM idem.idem_outbox_claim(10, '1 hour');
		SELECT count(*) >= 0 FROM idem.idem_outbox_backlog();
		SELECT decision FROM idem.idem_attempt_open('upload', 'tgt-app-1', 'r1-app', 'app', '{"n": 1}', 'a.pdf', NULL);
		SELECT decision FROM idem.idem_attempt_open('upload', 'tgt-app-2', 'r2-app', 'app', '{"n": 1}', 'b.pdf', NULL);
		SELECT decision FROM idem.idem_attempt_open('upload', 'tgt-app-new', 'r-new', 'app', '{"n": 1}', 'n.pdf', NULL);
		SELECT idem.idem_attempt_current('upload', 'tgt-app-1') IS NULL;
	}, stdout => \$out, stderr => \$err, extra_params => [ '-U', 'app' ]);
	is($err, '', 'held-by-intruder: app\'s own work neither waits nor fails while the intruder\'s attack is open');
	note("app's answers:\n$out");
	$s->query_safe('COMMIT');
	$s->quit;
	verdict('held-by-intruder');
}

HostileRoles::advisory_attacks($node, $LOCK_TIMEOUT, $sql_script);

# --- (Last of the attacks in app's scope: it leaves rows there.)
# An AFTER trigger of a cascaded row is another matter: PostgreSQL queues
# it for the statement that cascaded, which runs it as the deleting role
# (app), with app's privileges on everything: the intruder's code can do
# what app may, pg_idem's calls in app's scope included.  What must hold:
# it reaches no third role's rows (the superuser's).
judged('fk-cascade-after', [ 'intruder', 'app' ], sub {
	my ($rc, $out, $err) = try_as('app', "$LOCK_TIMEOUT DELETE FROM app.parent WHERE id = 2");
	diag($err) if $rc;
	return $rc == 0;
}, 'app');

# --- A new role under app's old name (app was renamed): none of the old
# app's rows are its own.
$node->safe_psql('postgres', q{
	ALTER ROLE app RENAME TO app_renamed;
	CREATE ROLE app LOGIN;
	GRANT idem_client TO app;
	GRANT USAGE ON SCHEMA intruder TO app;
});
judged('same-name', ['app'], sub {
	my ($rc, $out, $err) = try_as('app', "$LOCK_TIMEOUT SELECT intruder.attack('same-name')");
	diag($err) if $rc;
	return $rc == 0;
});

$node->stop;
done_testing();
