# The outbox across the update to idem_outbox_claimed (issue 35): a 0.5.0
# database served by this library, with events in every shape, then
# ALTER EXTENSION pg_idem UPDATE.
#   - Before the update the library runs on 0.5.0's tables: its claims
#     lease in the queue, its acks mark published there, its nacks kill
#     there, and 0.5.0's archive (a table) keeps what 0.5.0 archived.
#   - The update moves every event a claim has taken (leased, dead,
#     published in the queue) and the archive's rows into
#     idem_outbox_claimed; the queue keeps the never-claimed ones only;
#     idem_outbox_archive becomes a view of the published events.
#   - A table of the new table's name that is not pg_idem's is not used
#     before the update (a WARNING says so; the prune leaves it alone).
#   - After it, nothing is lost or handed out twice: the lease taken
#     before the update acks with its token, the key's next event waits
#     for its head and then goes, the dead one is redriven, and the
#     published ones are kept and pruned as before.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('claimed_upgrade');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_idem'
idem.cleanup_worker = off
});
$node->start;

sub q1 { return $node->safe_psql('postgres', $_[0]); }

my $previous = q1(q{SELECT max(version) FROM pg_available_extension_versions
                     WHERE name = 'pg_idem' AND version < (SELECT default_version
                       FROM pg_available_extensions WHERE name = 'pg_idem')});
q1("CREATE EXTENSION pg_idem VERSION '$previous'");
is(q1(q{SELECT count(*) FROM pg_class WHERE relname = 'idem_outbox_archive' AND relkind = 'r'}),
	'1', "$previous: the archive is a table");

# id of each event by name.
my %id;
for my $name (qw(acked leased dead head next fresh))
{
	my $key = $name eq 'head' || $name eq 'next' ? "'order/1'" : 'NULL';
	$id{$name} = q1(qq{SELECT idem_outbox_stage('up', jsonb_build_object('name', '$name'), $key)});
}
# What 0.5.0's ack archived, as it wrote it.
q1(q{INSERT INTO idem_outbox_archive (id, topic, payload, attempts, available_at, claim_token,
                                       created_at, published_at, scope)
     SELECT nextval('idem_outbox_id_seq'), 'up', '{"name": "archived"}', 1, clock_timestamp(),
            gen_random_uuid(), clock_timestamp(), clock_timestamp(), current_user::regrole});

# This library on 0.5.0's tables: a claim of everything claimable (the
# key's next event waits for its head; "fresh" is left for after).
my %token = map { split /\|/ } split /\n/, q1(q{
	SELECT payload->>'name' || '|' || claim_token FROM idem_outbox_claim(4, '1 hour')});
is(join(',', sort keys %token), 'acked,dead,head,leased', 'before: the claim takes what is due, in order');
is(q1("SELECT idem_outbox_ack('$token{acked}', ARRAY[$id{acked}])"), '1', 'before: an ack');
is(q1(qq{SET idem.outbox_max_attempts = 1;
         SELECT (idem_outbox_nack('$token{dead}', $id{dead}, 'gone')).outcome}), 'dead',
	'before: a nack of the last attempt');
is(q1(q{SELECT string_agg(payload->>'name' || ' ' || state, ', ' ORDER BY id) FROM idem_outbox_queue}),
	'acked published, leased pending, dead dead, head pending, next pending, fresh pending',
	'before: every event in the queue, published in place');
is(q1(q{SELECT count(*) FROM idem_outbox_archive}), '1', "before: the archive holds 0.5.0's row only");
is(q1(q{SELECT idem_outbox_prune('1 hour')}), '0', 'before: the prune runs on the old tables');

# A table of the new table's name that is not pg_idem's, planted in its
# schema before the update (a schema others may create in): not used.  The
# prune would have deleted its row, published two days ago.
q1(q{CREATE TABLE public.idem_outbox_claimed (id bigint, state text, published_at timestamptz,
                                              dead_at timestamptz);
     INSERT INTO public.idem_outbox_claimed VALUES (1, 'published', now() - interval '2 days')});
my ($rc, $pruned, $err) = $node->psql('postgres', q{SELECT idem_outbox_prune('1 hour')});
is($pruned, '0', 'before: a planted idem_outbox_claimed ...');
like($err, qr/WARNING:  table idem_outbox_claimed does not belong to extension pg_idem: not used/,
	'... is said not to be used ...');
is(q1('SELECT count(*) FROM public.idem_outbox_claimed'), '1', '... and is not pruned');
q1('DROP TABLE public.idem_outbox_claimed');

q1('ALTER EXTENSION pg_idem UPDATE');

is(q1(q{SELECT string_agg(payload->>'name', ', ' ORDER BY id) FROM idem_outbox_queue}),
	'next, fresh', 'after: the queue keeps the events no claim took');
is(q1(q{SELECT string_agg(payload->>'name' || ' ' || state || ' ' || attempts, ', ' ORDER BY id)
          FROM idem_outbox_claimed}),
	'acked published 1, leased pending 1, dead dead 1, head pending 1, archived published 1',
	'after: the claimed table has every event a claim took, and the archived one');
is(q1(q{SELECT count(*) FROM pg_class WHERE relname = 'idem_outbox_archive' AND relkind = 'v'}),
	'1', 'after: the archive is a view');
is(q1(q{SELECT string_agg(payload->>'name', ', ' ORDER BY id) FROM idem_outbox_archive}),
	'acked, archived', 'after: it shows the published events');
is(q1(q{SELECT count(*) || ' ' || count(DISTINCT id) FROM idem_outbox WHERE topic = 'up'}),
	'7 7', 'after: every event once');

# The drain goes on.
is(q1(q{SELECT string_agg(payload->>'name', ',') FROM idem_outbox_claim(10)}), 'fresh',
	"after: a claim takes the never-claimed event, not the key's next (its head is leased)");
is(q1("SELECT idem_outbox_ack(gen_random_uuid(), ARRAY[$id{leased}, $id{head}])"), '0',
	'after: another token acks nothing ...');
is(q1("SELECT idem_outbox_ack('$token{head}', ARRAY[$id{head}, $id{leased}])"), '2',
	'... the leases taken before the update ack with their token ...');
is(q1("SELECT idem_outbox_ack('$token{head}', ARRAY[$id{head}])"), '0', '... once');
is(q1(q{SELECT string_agg(payload->>'name', ',') FROM idem_outbox_claim(10)}), 'next',
	"after: the key's next event goes once its head is published");
is(q1(q{SELECT string_agg(payload->>'name' || ' ' || redriven, ',') FROM idem_outbox_redrive(topic => 'up') r
          JOIN idem_outbox o USING (id)}), 'dead true', 'after: the dead event is redriven');
is(q1(q{SELECT string_agg(payload->>'name' || ' ' || attempts, ',') FROM idem_outbox_claim(10)}), 'dead 1',
	'after: and claimed again');
is(q1(q{SELECT idem_outbox_prune('0')}), '4', 'after: the prune deletes the four published events');
is(q1(q{SELECT string_agg(payload->>'name' || ' ' || state, ', ' ORDER BY id) FROM idem_outbox}),
	'dead pending, next pending, fresh pending', 'after: the leased events are left');

$node->stop;
done_testing();
