# Rolling upgrades (expand/contract): replicas of the previous release keep
# sending its SQL while the new library runs and the extension is updated
# under them (docs/guides/upgrading.md: "the new library serves the
# previous version's SQL objects until the update").
#
# The previous release's client statements (the C++ client's
# runner_statements.cpp as released with 0.5.0, sent unnamed-prepared with
# untyped parameters, as libpq's PQprepare with no types does) run as an
# idem_client role on a database of that version served by this library:
# claims are taken before ALTER EXTENSION pg_idem UPDATE, which runs while
# they are in flight, and then the same long-lived session (its prepared
# statements re-planned) and a new one renew, finalize, fail, release,
# replay, wait and claim anew.  Before the update the library also serves
# the rest of that version's objects: the outbox (stage, claim, ack), the
# inbox (begin, done), the attempts (open) and the cleanup.  A new client
# against the previous extension learns its version from pg_extension,
# which any role may read, and a call with a signature only the current
# version has fails with 42883, never silently.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $previous = '0.5.0';
my $node = PostgreSQL::Test::Cluster->new('rolling');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_idem'");
$node->start;
my $current = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'pg_idem'");
# A new release makes another version the previous one: its client's SQL
# goes here then.
is( $node->safe_psql(
		'postgres', "SELECT version FROM pg_available_extension_versions
		              WHERE name = 'pg_idem' AND version <> '$current'
		              ORDER BY string_to_array(version, '.')::int[] DESC LIMIT 1"),
	$previous, "$previous is the release before $current");

$node->safe_psql('postgres', 'CREATE DATABASE roll');
$node->safe_psql('roll', "CREATE EXTENSION pg_idem VERSION '$previous'");
$node->safe_psql('roll', 'CREATE ROLE replica LOGIN; GRANT idem_client TO replica');

# 0.5.0's client statements, verbatim but for the schema prefix (none).
my $cols = q{SELECT r.outcome, r.claim_id::text, r.generation, }
  . q{ceil(extract(epoch FROM r.retry_after) * 1000)::int8, }
  . q{r.response_status, r.response_headers::text, r.response_body};
my $wait_arg = sub {
	my ($w, $d) = ('$' . $_[0], '$' . ($_[0] + 1));
	return "GREATEST(LEAST($w\::interval, $d\::timestamptz OPERATOR(pg_catalog.-) "
	  . "pg_catalog.clock_timestamp()), '0'::interval)";
};
my $claim_from = q{ FROM (SELECT pg_catalog.set_config('lock_timeout', $4, true) AS lt) s }
  . q{CROSS JOIN LATERAL idem_claim($1, $2, CASE WHEN s.lt IS NOT NULL THEN $3::interval END};
my $begin_from = q{, pg_catalog.set_config('lock_timeout', s.old, true) }
  . q{FROM (SELECT pg_catalog.current_setting('lock_timeout') AS old, }
  . q{pg_catalog.set_config('lock_timeout', $3, true) AS lt) s }
  . q{CROSS JOIN LATERAL idem_begin($1, $2, CASE WHEN s.lt IS NOT NULL THEN NULL::interval END};
my %v05 = (
	claim => $cols . $claim_from . ') r',
	claim_wait => $cols . $claim_from . ', ' . $wait_arg->(5) . ') r',
	lookup => $cols . ' FROM idem_lookup($1, $2) r',
	begin => $cols . $begin_from . ') r',
	renew => q{SELECT CASE WHEN s.lt IS NOT NULL THEN }
	  . q{idem_renew($1, $2::uuid, $3::interval) IS NOT NULL END }
	  . q{FROM (SELECT pg_catalog.set_config('lock_timeout', $4, true) AS lt) s},
	finalize => q{SELECT idem_finalize($1, $2::uuid, $3::int4, $4::jsonb, $5, $6), }
	  . q{pg_catalog.current_setting('idem.max_response_bytes', true)}
	  . q{ FROM (SELECT CASE WHEN $7 THEN pg_catalog.set_config(}
	  . q{'idem.max_response_bytes', '0', true) END AS forced) s},
	release => q{SELECT idem_release($1, $2::uuid)},
	fail => q{SELECT idem_fail($1, $2::uuid, $3::interval)},);

# PREPARE every statement with untyped parameters.
my $prepare = join('', map { "PREPARE v05_$_ AS $v05{$_};\n" } sort keys %v05);

sub key { return "idem_key('replica', 'POST', '/roll', '$_[0]')" }

# One request's claim through the 0.5 statement: (outcome, claim_id, status).
sub claim
{
	my ($session, $name, $body) = @_;
	my $row = $session->query_safe(
		"EXECUTE v05_claim(" . key($name) . ", sha256('$body'), '30 s', '2s')");
	my @f = split /\|/, $row;
	return ($f[0], $f[1], $f[4]);
}

# A follower's claim that waits in the server up to 200 ms: its outcome.
sub claim_waiting
{
	my ($session, $name) = @_;
	my $row = $session->query_safe("EXECUTE v05_claim_wait(" . key($name)
		  . ", sha256('b'), '30 s', '2s', '200 ms', clock_timestamp() + interval '10 s')");
	return (split /\|/, $row)[0];
}

my $old = $node->background_psql('roll', on_error_stop => 1, connstr => $node->connstr('roll') . ' user=replica');
$old->query_safe($prepare);

# --- On the previous version, served by this library: claims in every state.
my %id;
foreach my $name (qw(renew_me fail_me release_me finish_me))
{
	my ($outcome, $claim_id) = claim($old, $name, 'b');
	is($outcome, 'claimed', "$previous: $name claimed");
	$id{$name} = $claim_id;
}
my ($o, $done_id) = claim($old, 'done', 'b');
is( $old->query_safe(
		"EXECUTE v05_finalize(" . key('done') . ", '$done_id', 201, '{\"a\": \"b\"}', 'before', false, false)"),
	't|2MB', "$previous: finalize");
is(claim_waiting($old, 'finish_me'), 'in_progress', "$previous: a follower waits in the server, then is told");
is($node->safe_psql('roll', "SELECT extversion FROM pg_extension WHERE extname = 'pg_idem'"),
	$previous, "the database runs $previous");

# --- The rest of the previous version's objects, before the update.
is( $old->query_safe(q{
BEGIN;
SELECT idem_outbox_stage('roll.before', '{"n": 1}'::jsonb, 'k') > 0;
COMMIT;
}),
	't', "$previous: the outbox stages");
my ($topic, $event, $token) = split /\|/, $old->query_safe(q{
BEGIN;
SELECT topic, id, claim_token FROM idem_outbox_claim(10, '1 minute');
COMMIT;
});
is($topic, 'roll.before', "$previous: the outbox claims");
is($old->query_safe("SELECT idem_outbox_ack('$token', ARRAY[$event]::bigint[])"),
	'1', "$previous: the outbox acks");
is( $old->query_safe(q{
BEGIN;
SELECT idem_inbox_begin('roll', 'm1', sha256('m'));
SELECT idem_inbox_done('roll', 'm1');
COMMIT;
SELECT idem_inbox_begin('roll', 'm1', sha256('m'));
}),
	"process\n\nduplicate", "$previous: the inbox begins, finishes and answers a duplicate");
$node->safe_psql('roll', q{SELECT idem_attempt_register_kind('roll_export', 'append', 'exports')});
is( $old->query_safe(q{
SELECT decision FROM idem_attempt_open('roll_export', 'acct-1', 'req-1', 'svc', '{"q": 1}');
SELECT decision FROM idem_attempt_open('roll_export', 'acct-1', 'req-1', 'svc', '{"q": 1}');
}),
	"new\nresume", "$previous: an attempt opens and resumes");
like($node->safe_psql('roll', 'SELECT idem_cleanup(100)'), qr/^\d+$/, "$previous: the cleanup runs");

# --- The update, with those claims in flight and the old session open.
$node->safe_psql('roll', 'ALTER EXTENSION pg_idem UPDATE');
is($node->safe_psql('roll', "SELECT extversion FROM pg_extension WHERE extname = 'pg_idem'"),
	$current, "updated to $current with claims in flight");

# --- The old session's prepared statements on the new version.
is($old->query_safe("EXECUTE v05_renew(" . key('renew_me') . ", '$id{renew_me}', '30 s', '2s')"),
	't', 'after the update: renew of a claim taken before it');
is( $old->query_safe(
		"EXECUTE v05_finalize(" . key('renew_me') . ", '$id{renew_me}', 201, NULL, 'after', false, false)"),
	't|2MB', 'after the update: finalize of that claim');
my ($outcome, $cid, $status) = claim($old, 'renew_me', 'b');
is("$outcome $status", 'replay 201', 'after the update: its retry replays');
is($old->query_safe("EXECUTE v05_fail(" . key('fail_me') . ", '$id{fail_me}', '1 hour')"),
	't', 'after the update: fail of a claim taken before it');
($outcome) = claim($old, 'fail_me', 'b');
is($outcome, 'cooldown', 'after the update: its retry is in cooldown');
is($old->query_safe("EXECUTE v05_release(" . key('release_me') . ", '$id{release_me}')"),
	't', 'after the update: release of a claim taken before it');
($outcome) = claim($old, 'release_me', 'b');
is($outcome, 'claimed', 'after the update: a released key is claimed again');
($outcome, $cid, $status) = claim($old, 'done', 'b');
is("$outcome $status", 'replay 201', 'after the update: a response stored by the previous version replays');
($outcome) = claim($old, 'done', 'other body');
is($outcome, 'mismatch', 'after the update: another body is still a mismatch');
is( $old->query_safe("EXECUTE v05_lookup(" . key('finish_me') . ", sha256('b'))") =~ s/\|.*//sr,
	'in_progress', 'after the update: lookup sees the claim in flight');
is(claim_waiting($old, 'finish_me'), 'in_progress', 'after the update: a follower still waits, then is told');
# In-transaction mode, begun and finished on the new version.
my $begin = $old->query_safe("BEGIN; EXECUTE v05_begin(" . key('in_txn') . ", sha256('b'), '2s')");
my @b = split /\|/, $begin;
is($b[0], 'claimed', 'after the update: idem_begin through the 0.5 statement');
is( $old->query_safe(
		"EXECUTE v05_finalize(" . key('in_txn') . ", '$b[1]', 200, NULL, 'tx', true, false); COMMIT"),
	't|2MB', 'after the update: strict finalize in the same transaction commits');

# --- A new session of an old replica: prepares and runs the same text.
my $fresh = $node->background_psql('roll', on_error_stop => 1, connstr => $node->connstr('roll') . ' user=replica');
$fresh->query_safe($prepare);
is( $fresh->query_safe(
		"EXECUTE v05_finalize(" . key('finish_me') . ", '$id{finish_me}', 201, NULL, 'late', false, false)"),
	't|2MB', "a new 0.5 session finalizes a claim taken on the previous version");
($outcome) = claim($fresh, 'brand_new', 'b');
is($outcome, 'claimed', 'a new 0.5 session claims a new key');
$old->quit;
$fresh->quit;

# --- A new client against the previous extension: it can learn the
# installed version at connect (pg_extension is readable by every role) and
# refuse with both versions named; a call with a signature only the
# current version has fails loudly (42883), it never falls back silently.
$node->safe_psql('postgres', 'CREATE DATABASE still_old');
$node->safe_psql('still_old', "CREATE EXTENSION pg_idem VERSION '$previous'");
is( $node->safe_psql(
		'still_old', "SET ROLE replica; SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_idem'"),
	$previous, 'an idem_client role reads the installed version');
my $signatures = q{SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_depend d
  ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_idem')
  WHERE p.prorettype <> 'trigger'::regtype ORDER BY 1};
my %old_signature = map { $_ => 1 } split /\n/, $node->safe_psql('still_old', $signatures);
my @added = grep { !$old_signature{$_} } split /\n/, $node->safe_psql('roll', $signatures);
note("signatures $current adds: " . (@added ? join(', ', @added) : 'none'));
foreach my $signature (@added)
{
	my ($name, $args) = $signature =~ /^(\w+)\((.*)\)$/;
	my $call = "SELECT $name(" . join(', ', map { "NULL::$_" } grep { $_ ne '' } split /\s*,\s*/, $args) . ')';
	my ($ret, $stdout, $stderr) = $node->psql('still_old', "SET ROLE replica; $call");
	# A function whose argument type is itself new (the redrive's internal
	# call types) fails one step earlier, on the type (42704): as loud.
	like($stderr,
		qr/ERROR:  (function \Q$name\E\(.*\) does not exist|type "idem__\w+" does not exist)/,
		"${current}'s $signature against $previous: 42883 (or 42704 for a new type), not a silent fallback");
}

$node->stop;
done_testing();
