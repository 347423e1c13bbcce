# Change data capture of the outbox (issue 33): what a logical-decoding
# reader (Debezium's PostgreSQL connector with its outbox event router, or
# any pgoutput or test_decoding consumer) sees of idem_outbox_queue, as
# docs/guides/inbox-outbox.md ("Change data capture") says.
#
# A real server with wal_level = logical; a publication of the queue's
# inserts only (the guide's) and one of every operation on the queue and
# idem_outbox_claimed; a pgoutput slot read with pg_logical_slot_peek_binary_changes
# (the wire format the connector reads, parsed below) and a test_decoding
# slot.  Staged by an idem_client role: an event before the slots existed,
# an unkeyed event, a keyed one, a batch, a rolled-back stage, a
# transaction staging two keys, two stagers of one key (the second waits
# for the first's commit), two keys committed in the other order than
# their ids, and a payload large enough to be TOASTed.  Then, before
# anything is read, every event is released through the API (claimed and
# acked: published) and the published events pruned.  Asserted:
#  - the reader gets only committed events, each once, in commit order,
#    one transaction per staging transaction, with id, topic, message_key
#    and payload as staged (the router's id, route-by field, key and
#    payload), the TOASTed payload whole: it reads the WAL, which the slot
#    keeps, not the table, so a release ahead of the reader loses nothing;
#  - a key's events come in commit order, which is their id order; across
#    keys ids do not follow commit order (no reader may use the id as a
#    position);
#  - the key-order slot lock writes nothing a reader sees;
#  - with publish = 'insert' nothing else reaches the reader; with every
#    operation published a first claim moves the event (a DELETE on the
#    queue, which the router filters, and an INSERT on
#    idem_outbox_claimed), the ack is an UPDATE there, the prune a DELETE
#    there; under the default replica identity (the primary key) a DELETE
#    carries the id alone and the ack's UPDATE does not carry an unchanged
#    TOASTed payload;
#  - REPLICA IDENTITY NOTHING on the queue makes every claim fail while a
#    publication publishes its deletes, and does not matter to an
#    insert-only one.
use strict;
use warnings;

use Digest::MD5 qw(md5_hex);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('cdc');
$node->init(allows_streaming => 'logical');
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'pg_idem'\nidem.cleanup_worker = off\n");
$node->start;

sub q1 { return $node->safe_psql('postgres', $_[0]); }
# As the application's role: its events carry its scope.
sub app { return $node->safe_psql('postgres', "SET ROLE app;\n$_[0]"); }

$node->safe_psql('postgres', q{
	CREATE EXTENSION pg_idem;
	CREATE ROLE app LOGIN;
	GRANT idem_client TO app;
	CREATE PUBLICATION cdc_inserts FOR TABLE idem_outbox_queue WITH (publish = 'insert');
	CREATE PUBLICATION cdc_all FOR TABLE idem_outbox_queue, idem_outbox_claimed;
});
app(q{SELECT idem_outbox_stage('orders', '{"n": 0}'::jsonb, key => 'order/1')});
q1(q{SELECT pg_create_logical_replication_slot('po', 'pgoutput')});
q1(q{SELECT pg_create_logical_replication_slot('td', 'test_decoding')});

# id of each payload's "n", as staging returned it.
my %id;
sub stage
{
	my ($n, $topic, $key) = @_;
	my $k = defined $key ? ", key => '$key'" : '';
	return $id{$n} = app(qq{SELECT idem_outbox_stage('$topic', '{"n": $n}'::jsonb$k)});
}

stage(1, 'orders');
stage(2, 'orders', 'order/1');
my @batch = split /\n/, app(q{
	SELECT idem_outbox_stage_batch('orders',
	    ARRAY['{"n": 3}', '{"n": 4}', '{"n": 5}']::jsonb[], ARRAY['order/2', NULL, 'order/1'])});
@id{ 3, 4, 5 } = @batch;
app(q{
	BEGIN;
	SELECT idem_outbox_stage('orders', '{"n": 99}'::jsonb, key => 'order/1');
	ROLLBACK;});
my @pair = split /\n/, app(q{
	BEGIN;
	SELECT idem_outbox_stage('payments', '{"n": 6}'::jsonb, key => 'order/2');
	SELECT idem_outbox_stage('orders', '{"n": 7}'::jsonb, key => 'order/1');
	COMMIT;});
@id{ 6, 7 } = @pair;

# Two stagers of one key: the second waits for the first's commit and
# draws its id after it; an unkeyed event meanwhile waits for nobody.
my $first = $node->background_psql('postgres');
$first->query_safe('SET ROLE app');
$first->query_safe('BEGIN');
$id{8} = $first->query_safe(q{SELECT idem_outbox_stage('orders', '{"n": 8}'::jsonb, key => 'order/3')});
my $second = $node->background_psql('postgres');
$second->query_safe('SET ROLE app');
$second->query_safe('BEGIN');
$second->query_until(qr/staging/, q{
	\echo staging
	SELECT 'second got ' || idem_outbox_stage('orders', '{"n": 9}'::jsonb, key => 'order/3');
});
ok( $node->poll_query_until('postgres', q{
		SELECT wait_event_type = 'Lock' FROM pg_stat_activity
		 WHERE query LIKE '%second got%' AND pid <> pg_backend_pid()}),
	'a second stager of a key waits for the first one');
stage(10, 'orders');
$first->query_safe('COMMIT');
($id{9}) = $second->query_safe('COMMIT') =~ /second got (\d+)/;
cmp_ok($id{9}, '>', $id{8}, "the second stager's id ($id{9}) is above the first's ($id{8})");

# Two keys: the lower id commits last.
$first->query_safe('BEGIN');
$id{11} = $first->query_safe(q{SELECT idem_outbox_stage('orders', '{"n": 11}'::jsonb, key => 'order/4')});
stage(12, 'orders', 'order/5');
$first->query_safe('COMMIT');
$first->quit;
$second->quit;
cmp_ok($id{12}, '>', $id{11}, 'across keys, the event committed first has the higher id');

# A payload stored out of line (TOAST).
$id{13} = app(q{
	SELECT idem_outbox_stage('orders', jsonb_build_object('n', 13, 'blob',
	    (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 2000) i)), key => 'order/6')});
my $big_md5 = q1("SELECT md5(payload::text) FROM idem_outbox_queue WHERE id = $id{13}");
my $toast = q1(q{SELECT reltoastrelid::regclass FROM pg_class WHERE oid = 'idem_outbox_queue'::regclass});
cmp_ok(q1("SELECT count(*) FROM $toast"), '>', 0, 'the big payload is stored out of line');

# Released before anything is read: claimed and acked through the API
# (the guide's recipe), until nothing is left; then the published pruned.
my $released = 0;
while (1)
{
	my $n = app(q{
		SELECT coalesce(sum(idem_outbox_ack(claim_token, ids)), 0)
		  FROM (SELECT claim_token, array_agg(id) AS ids
		          FROM idem_outbox_claim(100) GROUP BY claim_token) c});
	last if $n == 0;
	$released += $n;
}
is($released, 14, 'every committed event released through claim and ack');
is(q1('SELECT count(*) FROM idem_outbox_queue'), '0', 'the queue is empty');
cmp_ok(q1(q{SELECT idem_outbox_prune('0 seconds')}), '==', 14, 'the published events pruned');

# The commit order, by payload "n"; the event staged before the slots and
# the rolled-back one are in no stream.
my @commit_order = (1, 2, 3, 4, 5, 6, 7, 10, 8, 9, 12, 11, 13);
my %key_of = (2 => 'order/1', 3 => 'order/2', 5 => 'order/1', 6 => 'order/2', 7 => 'order/1',
	8 => 'order/3', 9 => 'order/3', 11 => 'order/4', 12 => 'order/5', 13 => 'order/6');

### pgoutput, the inserts-only publication: what the guide's connector reads.

my @inserts_only = pgoutput('cdc_inserts');
my @ops = map { $_->{op} } grep { $_->{op} =~ /^[IUDT]$/ } @inserts_only;
is_deeply([ sort keys %{ { map { $_ => 1 } @ops } } ], ['I'],
	'publish = insert: the reader gets inserts only, whatever was claimed, acked and pruned');
my @events = grep { $_->{op} eq 'I' } @inserts_only;
is(join(',', map { $_->{rel} } @events), join(',', ('public.idem_outbox_queue') x @events),
	'every insert is of idem_outbox_queue');
my @seen = map { ($_->{new}{payload} // '') =~ /^\{[^{]*?"n": (\d+)/ ? $1 : '?' } @events;
is("@seen", "@commit_order", 'only committed events, each once, in commit order');
is(join(',', map { $_->{new}{id} } @events), join(',', map { $id{$_} } @commit_order),
	'each with the id staging returned');
is(join(',', map { $_->{new}{topic} } @events),
	join(',', map { $_ == 6 ? 'payments' : 'orders' } @commit_order), 'each with its topic');
is(join(',', map { $_->{new}{message_key} // '(null)' } @events),
	join(',', map { $key_of{$_} // '(null)' } @commit_order), 'each with its key (null when unkeyed)');
is(md5_hex($events[-1]{new}{payload}), $big_md5,
	'the TOASTed payload arrives whole although its row was acked and pruned before the read');
is(join(' ', map { scalar @$_ } transactions(@inserts_only)), '1 1 3 2 1 1 1 1 1 1',
	'one transaction per staging transaction (the batch and the two-key one whole)');

my (%last, @out_of_order);
for my $i (0 .. $#commit_order)
{
	my $key = $key_of{ $commit_order[$i] } or next;
	my $id = $events[$i]{new}{id};
	push @out_of_order, $key if defined $last{$key} && $id < $last{$key};
	$last{$key} = $id;
}
is("@out_of_order", '', "each key's events come in id order (commit order is id order per key)");
ok($events[10]{new}{id} > $events[11]{new}{id},
	'across keys the reader sees a higher id before a lower one: ids are no position');

### pgoutput, every operation published: what a router must filter.

my @all = grep { $_->{op} =~ /^[IUD]$/ } pgoutput('cdc_all');
my %count;
$count{"$_->{op} $_->{rel}"}++ for @all;
is_deeply(\%count, {
		'I public.idem_outbox_queue'   => 13,
		'D public.idem_outbox_queue'   => 14,
		'I public.idem_outbox_claimed' => 14,
		'U public.idem_outbox_claimed' => 14,
		'D public.idem_outbox_claimed' => 14 },
	'all operations: claims move (queue deletes, claimed inserts), acks are updates, the prune deletes');
my ($delete) = grep { $_->{op} eq 'D' && $_->{rel} eq 'public.idem_outbox_queue' } @all;
is($delete->{old_kind}, 'K', 'a delete carries the replica identity (the primary key) ...');
is(join(',', grep { defined $delete->{old}{$_} } sort keys %{ $delete->{old} }), 'id',
	'... and of it only the id: no topic, key or payload');
my ($moved) = grep { $_->{op} eq 'I' && $_->{rel} eq 'public.idem_outbox_claimed'
	  && ($_->{new}{id} // '') eq $id{13} } @all;
is(md5_hex($moved->{new}{payload}), $big_md5, "the claim's move carries the event whole");
is($moved->{new}{state}, 'pending', '... pending, leased');
my ($ack) = grep { $_->{op} eq 'U' && ($_->{new}{id} // '') eq $id{13} } @all;
is($ack->{new}{payload}, '<unchanged TOAST>',
	"an ack's update does not carry the unchanged TOASTed payload");
is($ack->{new}{state}, 'published', "the ack's update says published");

### test_decoding: the key slots and the rolled-back stage.

my $decoded = q1(q{
	SELECT string_agg(data, E'\n') FROM pg_logical_slot_peek_changes('td', NULL, NULL,
	    'include-xids', '0', 'skip-empty-xacts', '1')});
unlike($decoded, qr/idem_outbox_key_slots/, 'the key slot lock is no change: never decoded');
unlike($decoded, qr/\{"n": 99\}/, 'the rolled-back stage is never decoded');
like($decoded, qr/UPDATE: .*payload\[jsonb\]:unchanged-toast-datum/,
	'test_decoding too shows the ack without the TOASTed payload');

### REPLICA IDENTITY.

app(q{SELECT idem_outbox_stage('orders', '{"n": 14}'::jsonb)});
q1('ALTER TABLE idem_outbox_queue REPLICA IDENTITY NOTHING');
my ($rc, $out, $err) = $node->psql('postgres', 'SET ROLE app; SELECT count(*) FROM idem_outbox_claim(10)');
like($err, qr/does not have a replica identity and publishes deletes/,
	'REPLICA IDENTITY NOTHING: a claim fails while a publication publishes deletes');
q1('DROP PUBLICATION cdc_all');
is(app('SELECT count(*) FROM idem_outbox_claim(10)'), '1',
	'with the inserts-only publication, the replica identity does not matter');
q1('ALTER TABLE idem_outbox_queue REPLICA IDENTITY DEFAULT');

q1(q{SELECT pg_drop_replication_slot('po'), pg_drop_replication_slot('td')});
$node->stop;
done_testing();

# The messages of slot po for one publication (pgoutput's protocol 1,
# "Logical Replication Message Formats"): hashes with op (B, C, R, I, U,
# D, ...), rel (schema.table), new and old (column name => text value,
# undef for NULL, '<unchanged TOAST>') and old_kind (K or O).
sub pgoutput
{
	my ($publication) = @_;
	my $hex = q1(qq{
		SELECT string_agg(encode(data, 'hex'), E'\\n' ORDER BY ord)
		  FROM pg_logical_slot_peek_binary_changes('po', NULL, NULL,
		      'proto_version', '1', 'publication_names', '$publication')
		  WITH ORDINALITY AS c(lsn, xid, data, ord)});
	my (%relations, @messages);
	for my $msg (map { pack('H*', $_) } split /\n/, $hex)
	{
		my $op = substr($msg, 0, 1);
		my $m = { op => $op };
		if ($op eq 'R')
		{
			my ($relid, $rest) = unpack('x N a*', $msg);
			my ($nspname, $relname, $tail) = split /\0/, $rest, 3;
			my ($ncols) = unpack('x n', $tail);
			my $pos = 3;
			my @cols;
			for (1 .. $ncols)
			{
				my $end = index($tail, "\0", $pos + 1);
				push @cols, substr($tail, $pos + 1, $end - $pos - 1);
				$pos = $end + 9;
			}
			$relations{$relid} = { name => "$nspname.$relname", cols => \@cols };
		}
		elsif ($op =~ /^[IUD]$/)
		{
			my $relid = unpack('x N', $msg);
			my $rel = $relations{$relid};
			$m->{rel} = $rel->{name};
			my $pos = 5;
			while ($pos < length $msg)
			{
				my $kind = substr($msg, $pos, 1);
				my ($tuple, $next) = tuple($msg, $pos + 1, $rel->{cols});
				if ($kind eq 'N') { $m->{new} = $tuple; }
				else { $m->{old} = $tuple; $m->{old_kind} = $kind; }
				$pos = $next;
			}
		}
		push @messages, $m;
	}
	return @messages;
}

# One TupleData at $pos: (column name => value, the position after it).
sub tuple
{
	my ($msg, $pos, $cols) = @_;
	my %t;
	my $n = unpack('n', substr($msg, $pos, 2));
	$pos += 2;
	for my $i (0 .. $n - 1)
	{
		my $kind = substr($msg, $pos++, 1);
		if ($kind eq 't')
		{
			my $len = unpack('N', substr($msg, $pos, 4));
			$t{ $cols->[$i] } = substr($msg, $pos + 4, $len);
			$pos += 4 + $len;
		}
		else
		{
			$t{ $cols->[$i] } = $kind eq 'u' ? '<unchanged TOAST>' : undef;
		}
	}
	return (\%t, $pos);
}

# The changes between each BEGIN and COMMIT, as lists (transactions
# without any left out).
sub transactions
{
	my (@xacts, $open);
	for my $m (@_)
	{
		if ($m->{op} eq 'B') { $open = []; }
		elsif ($m->{op} eq 'C') { push @xacts, $open if @$open; }
		elsif ($m->{op} =~ /^[IUD]$/) { push @$open, $m; }
	}
	return @xacts;
}
