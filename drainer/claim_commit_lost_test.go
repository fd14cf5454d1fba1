package drainer_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestClaimCommitLostHandsBack: the connection breaks after the claim's COMMIT reached the server
// and before its answer came back. The claim committed, so its job is dispatched under this
// drainer's id, and nothing will send it: it used to hold its room until its lease expired (with
// a global cap of a few jobs, a drain stopped for a lease; TestGaleraWriterKilled's producers
// filled the queue so when the proxy cut a claim's COMMIT as the writer moved). The pass hands it
// back on a fresh connection, and the next pass sends it.
func TestClaimCommitLostHandsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	recorded := make(chan int64, 1)
	c := behindCutter(t, func(*config.Config) {}, drainer.Config{ID: "cut",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}})
	db, proxy, id, sender, d := c.db, c.proxy, c.id, c.sender, c.d
	proxy.Armed.Store(true)
	p, err := d.RunOnce(ctx)
	if !sqldb.ConnectionLost(err) || p.Claimed != 0 || proxy.Cuts.Load() != 1 {
		t.Fatalf("pass with its COMMIT cut: %+v, %v, %d cuts; want the lost connection's error, nothing claimed, one cut", p, err, proxy.Cuts.Load())
	}
	if got := jobState(t, db.DB, id); got != "queued/dispatch_error/2/" {
		t.Fatalf("job after the cut claim: %s; want queued/dispatch_error/2/ (claimed, then handed back unsent)", got)
	}
	if got := trail(t, db.DB, id); got != "queued>dispatched,dispatched>queued" {
		t.Fatalf("the job's trail: %s; want its claim and its hand-back", got)
	}
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("the next pass: %+v, %v; want the job claimed again", p, err)
	}
	h := sender.Next(t)
	if h.JobID != id || h.N != 1 {
		t.Fatalf("dispatch %d of job %d; want the first, of job %d", h.N, h.JobID, id)
	}
	h.Reply(executor.Answer{Kind: executor.Done, Status: "succeeded"})
	drainertest.AwaitRecorded(t, recorded, 1)
	if got := jobState(t, db.DB, id); !strings.HasPrefix(got, "succeeded/") {
		t.Fatalf("job after its dispatch: %s; want succeeded", got)
	}
}

// TestClaimCommitLostBesideOutcomes: a claim that counted outcomes written beside it out of flight
// commits in a round trip of its own (store.Store.CommitClaim), after them; that COMMIT is the one
// cut here, as it was when TestGaleraWriterKilled's proxy moved the writer. The drain must not wait
// for the lease (a minute here, longer than the drain's wait) to get the claimed jobs back.
func TestClaimCommitLostBesideOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight, c.LeaseSeconds = 2, 2, 300 })
	drainertest.QueueJobs(t, db, 3, 30)
	proxy, viaProxy := apitest.DBThroughCutter(t, db)
	proxy.Match = func(roundTrip []byte) bool {
		// CommitClaim's round trip: the claim's audit rows, named by its nonces, without its UPDATE.
		return bytes.Contains(roundTrip, []byte("nonce_sha256 IN (")) && !bytes.Contains(roundTrip, []byte("UPDATE jobs"))
	}
	proxy.Armed.Store(true)
	drainAll(t, db, viaProxy, &drainertest.Executor{})
	if proxy.Cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d COMMITs; want one claim's", proxy.Cuts.Load())
	}
	var handedBack, expired int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(error_code = 'dispatch_error' OR NULL), COUNT(error_code = 'lease_expired' OR NULL)
		FROM audit_events WHERE from_status = 'dispatched' AND to_status = 'queued'`).Scan(&handedBack, &expired); err != nil {
		t.Fatal(err)
	}
	if handedBack < 1 || handedBack > 2 || expired != 0 {
		t.Fatalf("%d jobs handed back, %d requeued at their leases' expiry; want the cut claim's (1 or 2 jobs, cap 2) handed back, none expired", handedBack, expired)
	}
}

// TestClaimCommitWithheldLeavesOthersClaim: the connection breaks before the claim's COMMIT
// reaches the server, so the claim rolls back, and before its drainer hears of it another drainer
// claims the same job at the same version. The hand-back must tell the two claims apart by their
// nonces and leave the other drainer's dispatch alone: a job handed back while another drainer
// sends it would be sent again.
func TestClaimCommitWithheldLeavesOthersClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := behindCutter(t, func(*config.Config) {}, drainer.Config{ID: "cut"})
	db, proxy, id, cutSender, cut := c.db, c.proxy, c.id, c.sender, c.d
	otherSender := drainertest.NewHeld()
	recorded := make(chan int64, 1)
	other := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: otherSender, Clock: c.clk, ID: "other",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}}, 10*time.Second)
	type pass struct {
		p   drainer.Pass
		err error
	}
	others := make(chan pass, 1)
	proxy.OnWithheld = func() {
		p, err := other.RunOnce(ctx)
		others <- pass{p, err}
	}
	proxy.Withheld.Store(true)
	p, err := cut.RunOnce(ctx)
	if !sqldb.ConnectionLost(err) || p.Claimed != 0 || proxy.Cuts.Load() != 1 {
		t.Fatalf("pass with its COMMIT withheld: %+v, %v, %d cuts; want the lost connection's error, nothing claimed, one cut", p, err, proxy.Cuts.Load())
	}
	select {
	case o := <-others:
		if o.err != nil || o.p.Claimed != 1 {
			t.Fatalf("the other drainer's pass while the first waited for its COMMIT: %+v, %v; want the job claimed", o.p, o.err)
		}
	default:
		t.Fatal("the proxy cut the first drainer's COMMIT without running the other drainer's pass")
	}
	if got := jobState(t, db.DB, id); got != "dispatched//1/other" {
		t.Fatalf("job after both claims: %s; want dispatched//1/other (the other drainer's claim, untouched)", got)
	}
	h := otherSender.Next(t)
	if h.JobID != id {
		t.Fatalf("the other drainer sent job %d; want %d", h.JobID, id)
	}
	h.Reply(executor.Answer{Kind: executor.Done, Status: "succeeded"})
	// The other drainer records the answer in a goroutine of its own: the trail is read once it
	// has (reading it at once raced the outcome's write).
	drainertest.AwaitRecorded(t, recorded, 1)
	if got := trail(t, db.DB, id); got != "queued>dispatched,dispatched>succeeded" {
		t.Fatalf("the job's trail: %s; want the other drainer's claim and its outcome alone", got)
	}
	if n := len(cutSender.Hold); n != 0 {
		t.Fatalf("the drainer whose claim rolled back sent %d dispatches; want none", n)
	}
}

// TestClaimCommitLostDatabaseGone: the claim's connection is cut before its COMMIT reaches the
// server and the database stays out of reach. The hand-back keeps trying, backing off, until the
// lease would have freed the jobs anyway (1 s here), then says it could not tell and leaves them
// to lease recovery; nothing was claimed, and once the database is back the next pass claims the
// job.
func TestClaimCommitLostDatabaseGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logs := &messages{}
	c := behindCutter(t, func(c *config.Config) { c.LeaseSeconds = 1 }, drainer.Config{ID: "gone", Log: slog.New(logs)})
	db, proxy, id, sender, d := c.db, c.proxy, c.id, c.sender, c.d
	proxy.OnWithheld = func() { proxy.SetDown(true) }
	proxy.Withheld.Store(true)
	p, err := d.RunOnce(ctx)
	if !sqldb.ConnectionLost(err) || p.Claimed != 0 {
		t.Fatalf("pass with its COMMIT cut and the database gone: %+v, %v; want the lost connection's error, nothing claimed", p, err)
	}
	if !logs.has("could not tell whether a claim whose commit lost its connection took its jobs; lease recovery will requeue any it did") {
		t.Fatalf("logged %q; want the hand-back's giving up", logs.all())
	}
	proxy.SetDown(false)
	if got := jobState(t, db.DB, id); got != "queued//0/" {
		t.Fatalf("job after the failed claim: %s; want queued//0/, untouched", got)
	}
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("the pass after the database came back: %+v, %v; want the job claimed", p, err)
	}
	sender.Next(t).Reply(executor.Answer{Kind: executor.Done, Status: "succeeded"})
}

// messages is a slog.Handler that keeps the messages logged, for a test to look for one.
type messages struct {
	mu   sync.Mutex
	msgs []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) WithAttrs([]slog.Attr) slog.Handler       { return m }
func (m *messages) WithGroup(string) slog.Handler            { return m }

func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.msgs = append(m.msgs, r.Message)
	return nil
}

func (m *messages) all() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.msgs)
}

func (m *messages) has(msg string) bool { return slices.Contains(m.all(), msg) }

// cutterSetup is the lost-claim-commit tests' start: a database of one queued job, a COMMIT
// cutter in front of it, and a drainer through the cutter with an executor in hold mode.
type cutterSetup struct {
	db     *testdb.DB
	clk    *clock.Fake
	proxy  *apitest.CommitCutter
	id     int64
	sender *drainertest.Executor
	d      *drainer.Drainer
}

// behindCutter makes a cutterSetup whose runtime config edit changed, its drainer cfg with the
// database, executor and clock filled in.
func behindCutter(t *testing.T, edit func(*config.Config), cfg drainer.Config) cutterSetup {
	t.Helper()
	db, clk, t0 := drainertest.NewDB(t, edit)
	proxy, viaProxy := apitest.DBThroughCutter(t, db)
	c := cutterSetup{db: db, clk: clk, proxy: proxy, id: drainertest.QueueOneJob(t, db, t0), sender: drainertest.NewHeld()}
	cfg.DB, cfg.Executor, cfg.Clock = viaProxy, c.sender, clk
	c.d = drainertest.NewDrainer(t, cfg, 10*time.Second)
	return c
}

// jobState is the job's status, error code, version and drainer, as status/code/version/drainer.
func jobState(t *testing.T, db *sql.DB, id int64) string {
	t.Helper()
	var s string
	if err := db.QueryRowContext(context.Background(), `SELECT CONCAT_WS('/', status, COALESCE(error_code, ''), version,
		COALESCE(drainer_id, '')) FROM jobs WHERE id = ?`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// trail is the job's transitions in the audit trail, oldest first, as from>to,from>to.
func trail(t *testing.T, db *sql.DB, id int64) string {
	t.Helper()
	var s sql.NullString
	if err := db.QueryRowContext(context.Background(), `SELECT GROUP_CONCAT(CONCAT(from_status, '>', to_status) ORDER BY id)
		FROM audit_events WHERE job_id = ? AND from_status IS NOT NULL`, id).Scan(&s); err != nil {
		t.Fatal(errors.Join(err, errors.New("read the trail")))
	}
	return s.String
}
