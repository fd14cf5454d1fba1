package integration_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/migrations"
)

// BenchmarkMigrationLocks measures what each migration costs an installation that upgrades with
// data (deploy/RUNBOOK.md, "Upgrades: what each migration locks"). It runs only when
// SLUICE_BENCH_MIGRATION_ROWS is set (`make bench` skips it: it loads rows for a minute and prints
// a table, not figures). It creates a scratch database, applies 0001-0002, fills it
// (SLUICE_BENCH_MIGRATION_ROWS jobs, at least 10,000, a tenth of them queued, over rows/10
// tenants; as many outbox rows; as many audit rows once 0013 made the table),
// then applies every later migration one statement at a time on one connection opened as `sluice
// migrate` opens it, and drops the database at the end.
//
// While each statement runs, one writer per kind of write that a live installation makes (update
// a job, insert a job, lock a tenant's row as an admission does, insert an outbox row, an audit
// row, a slot) writes every 20 ms on a connection of its own, and the longest any one write took
// is reported: a write that waited for the whole statement was blocked by it. Each ALTER without a
// LOCK clause is first tried with LOCK=NONE: MariaDB either runs it so (the default would have
// been the same: it picks the least locking it supports) or refuses at once, and the refusal is
// reported before the statement runs as written. Beside what the migrations do, 0010's recount is
// also measured in batches of 1,000 tenants, each its own transaction.
//
// The output is a table on the benchmark's log:
//
//	SLUICE_BENCH_MIGRATION_ROWS=500000 go test -run '^$' -bench MigrationLocks -benchtime 1x -timeout 30m -v ./integration/
//
// Times depend on the server's buffer pool and the machine's load: the figures in the RUNBOOK
// name theirs.
func BenchmarkMigrationLocks(b *testing.B) {
	v := os.Getenv("SLUICE_BENCH_MIGRATION_ROWS")
	if v == "" {
		b.Skip("set SLUICE_BENCH_MIGRATION_ROWS (e.g. 500000) to measure what each migration locks")
	}
	rows, err := strconv.Atoi(v)
	if err != nil || rows < 10_000 {
		b.Fatalf("SLUICE_BENCH_MIGRATION_ROWS=%q: want a number of at least 10000", v)
	}
	for range b.N {
		measureMigrations(b, rows)
	}
}

// lockProbe is one kind of write a live installation makes, tried while a statement runs.
type lockProbe struct {
	name  string
	since int // the migration that made its table: it writes during the later ones
	write func(ctx context.Context, db *sql.DB, rng *rand.Rand) error
}

// migrationProbes returns the writes tried during each statement, for a database of rows jobs
// (ids 1..rows) over tenants t1..t<tenants>.
func migrationProbes(rows, tenants int) []lockProbe {
	tenant := func(rng *rand.Rand) string { return "t" + strconv.Itoa(1+rng.IntN(tenants)) }
	return []lockProbe{
		{"job update", 1, func(ctx context.Context, db *sql.DB, rng *rand.Rand) error {
			_, err := db.ExecContext(ctx, "UPDATE jobs SET attempt = attempt + 1 WHERE id = ?", 1+rng.IntN(rows))
			return err
		}},
		{"job insert", 1, func(ctx context.Context, db *sql.DB, rng *rand.Rand) error {
			_, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES (?, 'succeeded', UTC_TIMESTAMP(6))", tenant(rng))
			return err
		}},
		{"tenant lock", 1, func(ctx context.Context, db *sql.DB, rng *rand.Rand) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			var got string
			if err := tx.QueryRowContext(ctx, "SELECT tenant FROM tenants WHERE tenant = ? FOR UPDATE", tenant(rng)).Scan(&got); err != nil {
				return err
			}
			return tx.Commit()
		}},
		{"outbox insert", 1, func(ctx context.Context, db *sql.DB, _ *rand.Rand) error {
			_, err := db.ExecContext(ctx, "INSERT INTO outbox (subject, payload, created_at) VALUES ('probe', 'x', UTC_TIMESTAMP(6))")
			return err
		}},
		{"audit insert", 13, func(ctx context.Context, db *sql.DB, rng *rand.Rand) error {
			_, err := db.ExecContext(ctx, "INSERT INTO audit_events (event, tenant) VALUES ('probe', ?)", tenant(rng))
			return err
		}},
		{"slot insert", 15, func(ctx context.Context, db *sql.DB, rng *rand.Rand) error {
			_, err := db.ExecContext(ctx, `INSERT INTO slots (tenant, caller, lease_seconds, expires_at, created_at)
				VALUES (?, 'probe', 60, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`, tenant(rng))
			return err
		}},
	}
}

// probeResult is what one kind of write saw during a statement.
type probeResult struct {
	writes  int
	longest time.Duration
	err     error
}

// runProbes starts a writer per probe whose table exists before version, each writing every 20 ms
// (a pace, not a wait for a condition: it bounds the load the writers add to the statement), and
// returns a stop that ends them and returns what each saw, after its write in progress ends.
func runProbes(db *sql.DB, probes []lockProbe, version int) (stop func() map[string]probeResult) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	out := map[string]probeResult{}
	for i, p := range probes {
		if p.since >= version {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(version)))
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			var r probeResult
			for ctx.Err() == nil {
				start := time.Now()
				// The write runs to its end even once stop is called: a write the statement
				// blocked counts for as long as it waited.
				err := p.write(context.Background(), db, rng)
				r.longest = max(r.longest, time.Since(start))
				r.writes++
				if err != nil && r.err == nil {
					r.err = err
				}
				select {
				case <-ctx.Done():
				case <-tick.C:
				}
			}
			mu.Lock()
			out[p.name] = r
			mu.Unlock()
		}()
	}
	return func() map[string]probeResult {
		cancel()
		wg.Wait()
		return out
	}
}

// migrationLine is one measured statement.
type migrationLine struct {
	migration, what string
	took            time.Duration
	seen            map[string]probeResult
	note            string
}

// lockClause finds an ALTER's own LOCK= clause.
var lockClause = regexp.MustCompile(`(?i)\bLOCK\s*=`)

// measureMigrations is one run of BenchmarkMigrationLocks.
func measureMigrations(b *testing.B, rows int) {
	ctx := context.Background()
	tenants := rows / 10
	admin, err := sql.Open("mysql", testdb.ServerDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	var raw [6]byte
	_, _ = crand.Read(raw[:])
	name := "sluice_migbench_" + hex.EncodeToString(raw[:])
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE "+name); err != nil {
			b.Errorf("drop %s: %v", name, err)
		}
	}()
	cfg, err := mysql.ParseDSN(testdb.ServerDSN())
	if err != nil {
		b.Fatal(err)
	}
	cfg.DBName = name
	// `sluice migrate`'s connection (store.Open), with a read timeout no statement here reaches:
	// the 30 s default would cut a long one (see the RUNBOOK).
	mcfg := *cfg
	mcfg.ReadTimeout = time.Hour
	mdb, err := store.Open(ctx, mcfg.FormatDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer mdb.Close()
	conn, err := mdb.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	// The writers: READ COMMITTED as sluice's, and a lock wait longer than any statement here, so
	// that a blocked write reports the whole wait instead of failing after 10 s.
	wcfg := *cfg
	wcfg.Params = map[string]string{"tx_isolation": "'READ-COMMITTED'", "innodb_lock_wait_timeout": "3600"}
	wdb, err := sql.Open("mysql", wcfg.FormatDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer wdb.Close()
	probes := migrationProbes(rows, tenants)

	exec := func(q string) {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			b.Fatalf("%.80s: %v", q, err)
		}
	}
	// load runs the statements that fill the tables before version, untimed, in 100,000-row
	// statements: a transaction of a million rows outgrows what the server's undo handles quickly.
	load := func(version int) {
		chunks := func(n int, stmt func(from, to int) string) {
			for from := 1; from <= n; from += 100_000 {
				exec(stmt(from, min(from+99_999, n)))
			}
		}
		switch version {
		case 3:
			chunks(tenants, func(from, to int) string {
				return fmt.Sprintf(`INSERT INTO tenants (tenant, created_at) SELECT CONCAT('t', seq), UTC_TIMESTAMP(6) FROM seq_%d_to_%d`, from, to)
			})
			// A job every tenth queued, a rate key on every fourth, a 200-byte payload.
			chunks(rows, func(from, to int) string {
				return fmt.Sprintf(`INSERT INTO jobs (tenant, status, queued_at, payload, rate_key_sha256, attempt, finished_at)
					SELECT CONCAT('t', 1 + seq MOD %d), IF(seq MOD 10 = 0, 'queued', 'succeeded'),
						UTC_TIMESTAMP(6) - INTERVAL seq SECOND, REPEAT('p', 200), IF(seq MOD 4 = 0, SHA2(seq MOD 100, 256), NULL),
						IF(seq MOD 10 = 0, 0, 1), IF(seq MOD 10 = 0, NULL, UTC_TIMESTAMP(6))
					FROM seq_%d_to_%d`, tenants, from, to)
			})
			// One row unpublished in a hundred.
			chunks(rows, func(from, to int) string {
				return fmt.Sprintf(`INSERT INTO outbox (subject, payload, created_at, published_at)
					SELECT CONCAT('sluice.poke.enqueue.t', seq MOD 1000), REPEAT('o', 80), UTC_TIMESTAMP(6),
						IF(seq MOD 100 = 0, NULL, UTC_TIMESTAMP(6)) FROM seq_%d_to_%d`, from, to)
			})
		case 16:
			chunks(rows, func(from, to int) string {
				return fmt.Sprintf(`INSERT INTO audit_events (event, tenant, job_id, actor, detail)
					SELECT 'admitted', CONCAT('t', 1 + seq MOD %d), seq, 'producer', '{"limit": 2}' FROM seq_%d_to_%d`, tenants, from, to)
			})
		}
	}

	all, err := migrations.All()
	if err != nil {
		b.Fatal(err)
	}
	var lines []migrationLine
	// measure runs qs, one statement or the statements from a LOCK TABLES to its UNLOCK TABLES
	// (whose writes wait until the UNLOCK), while the writers write, and records it.
	measure := func(m migrations.Migration, what string, qs []string, note string) error {
		stop := runProbes(wdb, probes, m.Version)
		start := time.Now()
		var err error
		for _, q := range qs {
			if _, err = conn.ExecContext(ctx, q); err != nil {
				break
			}
		}
		took := time.Since(start)
		seen := stop()
		if err != nil {
			return err
		}
		lines = append(lines, migrationLine{m.Name, what, took, seen, note})
		return nil
	}
	short := func(q string) string {
		q = strings.Join(strings.Fields(q), " ")
		if len(q) > 72 {
			q = q[:72] + "…"
		}
		return q
	}
	for _, m := range all {
		load(m.Version)
		if m.Version <= 2 {
			for _, q := range migrations.Statements(m.SQL) {
				exec(q)
			}
			continue
		}
		var locked []string // the statements since a LOCK TABLES
		for _, q := range migrations.Statements(m.SQL) {
			upper := strings.ToUpper(strings.TrimSpace(q))
			switch {
			case strings.HasPrefix(upper, "LOCK TABLES"):
				locked = []string{q}
				continue
			case strings.HasPrefix(upper, "UNLOCK TABLES"):
				locked = append(locked, q)
				if err := measure(m, fmt.Sprintf("%s … UNLOCK TABLES (%d statements)", short(locked[0]), len(locked)), locked, ""); err != nil {
					b.Fatalf("%s: %v", m.Name, err)
				}
				locked = nil
				continue
			case locked != nil:
				locked = append(locked, q)
				continue
			}
			if strings.HasPrefix(upper, "UPDATE TENANTS T SET") && m.Version == 10 {
				lines = append(lines, recountInBatches(b, conn, wdb, probes, m, q, tenants))
			}
			if strings.HasPrefix(upper, "ALTER TABLE") && !lockClause.MatchString(q) {
				err := measure(m, short(q)+", LOCK=NONE", []string{q + ", LOCK=NONE"}, "")
				if err == nil {
					continue
				}
				var me *mysql.MySQLError
				if !errors.As(err, &me) {
					b.Fatalf("%s: %v", m.Name, err)
				}
				if err := measure(m, short(q), []string{q}, fmt.Sprintf("LOCK=NONE refused: %d %s", me.Number, me.Message)); err != nil {
					b.Fatalf("%s: %v", m.Name, err)
				}
				continue
			}
			if err := measure(m, short(q), []string{q}, ""); err != nil {
				b.Fatalf("%s: %v", m.Name, err)
			}
		}
	}

	var out strings.Builder
	fmt.Fprintf(&out, "\n%d jobs (%d queued), %d tenants, %d outbox rows, %d audit rows\n", rows, rows/10, tenants, rows, rows)
	for _, l := range lines {
		fmt.Fprintf(&out, "%-34s %8.2fs  %s\n", l.migration, l.took.Seconds(), l.what)
		var kinds []string
		for _, p := range probes {
			r, ok := l.seen[p.name]
			if !ok {
				continue
			}
			s := fmt.Sprintf("%s %d× ≤%.2fs", p.name, r.writes, r.longest.Seconds())
			if r.err != nil {
				s += " (" + r.err.Error() + ")"
			}
			kinds = append(kinds, s)
		}
		fmt.Fprintf(&out, "%45s %s\n", "", strings.Join(kinds, "; "))
		if l.note != "" {
			fmt.Fprintf(&out, "%45s %s\n", "", l.note)
		}
	}
	b.Log(out.String())
}

// recountInBatches measures 0010's recount statement q run 1,000 tenants at a time, each batch
// its own transaction, as the line of the alternative.
func recountInBatches(b *testing.B, conn *sql.Conn, wdb *sql.DB, probes []lockProbe, m migrations.Migration, q string, tenants int) (l migrationLine) {
	ctx := context.Background()
	stop := runProbes(wdb, probes, m.Version)
	start := time.Now()
	var longest time.Duration
	after := ""
	batches := 0
	for {
		var upTo sql.NullString
		err := conn.QueryRowContext(ctx, "SELECT MAX(tenant) FROM (SELECT tenant FROM tenants WHERE tenant > ? ORDER BY tenant LIMIT 1000) t", after).Scan(&upTo)
		if err != nil {
			b.Fatalf("%s batch bound: %v", m.Name, err)
		}
		if !upTo.Valid {
			break
		}
		t0 := time.Now()
		if _, err := conn.ExecContext(ctx, q+" WHERE t.tenant > ? AND t.tenant <= ?", after, upTo.String); err != nil {
			b.Fatalf("%s batch: %v", m.Name, err)
		}
		longest = max(longest, time.Since(t0))
		batches++
		after = upTo.String
	}
	l.took = time.Since(start)
	l.seen = stop()
	l.migration, l.what = m.Name, "alt: the recount, 1,000 tenants a statement"
	l.note = fmt.Sprintf("%d batches for %d tenants, the longest %.3fs", batches, tenants, longest.Seconds())
	return l
}
