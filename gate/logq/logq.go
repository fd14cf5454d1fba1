// Package logq keeps logging from blocking work (SPEC §10): a slog handler formats each record
// as slog.JSONHandler does and puts the line on a bounded queue, and one writer goroutine copies
// the queue to the sink. A sink that stops reading (a full pipe, a stalled journald) then costs a
// logging call a copy and a channel send, never a wait: when the queue is full the line is
// dropped and counted, and the next line written carries `log_dropped: N`.
//
// It sits with the building blocks and imports only the standard library, so that any process
// wiring (cmd/sluice) can put it under its logger.
package logq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Queue. Field docs give the defaults.
type Config struct {
	// Sink receives the log lines, one Write call per line (a JSON object and a newline), from
	// one goroutine. Its errors are ignored: there is nowhere left to report them. Required.
	Sink io.Writer
	// Capacity is how many lines may wait for the sink; a line logged when that many wait is
	// dropped. Default 4096: at about 300 bytes a line, a megabyte and a few seconds of a busy
	// process's transitions, enough to ride out a sink's hiccup without holding much memory.
	Capacity int
	// CloseTimeout bounds Close's wait for the queued lines. Default 2 s (SPEC §10: a process
	// exits after waiting at most 2 s for its log).
	CloseTimeout time.Duration
	// Options are the JSON handler's options: the level, AddSource, ReplaceAttr. Default nil
	// (level info), as for slog.NewJSONHandler.
	Options *slog.HandlerOptions
}

// DroppedKey is the attribute that a line written after dropped lines carries, with the number
// of lines dropped since the line written before it.
const DroppedKey = "log_dropped"

// ErrGaveUp is what Close's error wraps when it stopped waiting for the sink with lines left.
var ErrGaveUp = errors.New("logq: gave up waiting for the log sink")

// GaveUpError is Close's error when the sink did not take every queued line in time. It
// matches ErrGaveUp with errors.Is.
type GaveUpError struct {
	// Left is the number of lines queued or being written when Close gave up.
	Left int64
}

func (e *GaveUpError) Error() string {
	return fmt.Sprintf("%v: %d line(s) unwritten", ErrGaveUp, e.Left)
}

// Is reports whether target is ErrGaveUp.
func (e *GaveUpError) Is(target error) bool { return target == ErrGaveUp }

// Queue is a bounded queue of log lines and the goroutine that writes them to the sink. New
// starts the goroutine and Close stops it; the handler from Handler feeds it. Safe for
// concurrent use.
type Queue struct {
	sink         io.Writer
	closeTimeout time.Duration
	lines        chan *[]byte
	pool         sync.Pool // of *[]byte, the lines' buffers, returned by the writer

	root *Handler

	dropped   atomic.Uint64 // lines dropped since New
	pending   atomic.Uint64 // lines dropped since the last line written
	unwritten atomic.Int64  // lines enqueued and not yet written
	closing   atomic.Bool   // set by Close: lines logged from then on are dropped

	stop      chan struct{} // closed by Close: write what is queued, then exit
	abandon   chan struct{} // closed when Close gives up: exit after the Write in progress
	done      chan struct{} // closed when the writer goroutine has exited
	closeOnce sync.Once
	closeErr  error
}

// New validates cfg, fills in its defaults and starts the writer goroutine. The caller must call
// Close. Errors name the invalid field.
func New(cfg Config) (*Queue, error) {
	if cfg.Sink == nil {
		return nil, errors.New("invalid config: Sink: required")
	}
	if cfg.Capacity < 0 {
		return nil, fmt.Errorf("invalid config: Capacity: %d is negative", cfg.Capacity)
	}
	if cfg.CloseTimeout < 0 {
		return nil, fmt.Errorf("invalid config: CloseTimeout: %s is negative", cfg.CloseTimeout)
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = 4096
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = 2 * time.Second
	}
	q := &Queue{
		sink:         cfg.Sink,
		closeTimeout: cfg.CloseTimeout,
		lines:        make(chan *[]byte, cfg.Capacity),
		stop:         make(chan struct{}),
		abandon:      make(chan struct{}),
		done:         make(chan struct{}),
	}
	// One JSON handler for the queue: handlers derived from it share its mutex, so enqueue
	// runs for one line at a time and lines enter the queue in the order they were formatted.
	q.root = &Handler{q: q, h: slog.NewJSONHandler(enqueuer{q}, cfg.Options)}
	go q.run()
	return q, nil
}

// Handler returns the queue's handler. Handlers derived from it (WithAttrs, WithGroup) feed
// the same queue.
func (q *Queue) Handler() *Handler { return q.root }

// Dropped returns the number of lines dropped since New because the queue was full or closed.
// Safe for concurrent use; never blocks.
func (q *Queue) Dropped() uint64 { return q.dropped.Load() }

// Close stops taking lines (lines logged from then on are dropped and counted), waits until the
// writer has written every queued line, at most Config.CloseTimeout and at most until ctx ends,
// and stops the writer. It returns nil when everything queued was written, else a *GaveUpError
// (matching ErrGaveUp). A sink's Write cannot be interrupted: after Close gives up, the writer
// goroutine stays in the Write in progress until the sink returns, then exits without writing
// more. Idempotent: later calls return the first call's result.
func (q *Queue) Close(ctx context.Context) error {
	q.closeOnce.Do(func() {
		q.closing.Store(true)
		close(q.stop)
		t := time.NewTimer(q.closeTimeout)
		defer t.Stop()
		select {
		case <-q.done:
			return
		case <-t.C:
		case <-ctx.Done():
		}
		close(q.abandon)
		q.closeErr = &GaveUpError{Left: q.unwritten.Load()}
	})
	return q.closeErr
}

// run is the writer goroutine: it writes lines as they come until Close, then what is left.
func (q *Queue) run() {
	defer close(q.done)
	for {
		select {
		case b := <-q.lines:
			q.write(b)
		case <-q.stop:
			for {
				select {
				case <-q.abandon:
					return
				default:
				}
				select {
				case b := <-q.lines:
					q.write(b)
				default:
					return
				}
			}
		}
	}
}

// write writes one line, with the count of lines dropped since the last line written spliced
// in as DroppedKey, and recycles its buffer.
func (q *Queue) write(b *[]byte) {
	line := *b
	if n := q.pending.Swap(0); n > 0 {
		line = withDropped(line, n)
	}
	_, _ = q.sink.Write(line)
	q.unwritten.Add(-1)
	*b = line[:0]
	q.pool.Put(b)
}

// withDropped returns line (a JSON object and a newline) with `"log_dropped":n` added as the
// object's last member, top level whatever groups the line has.
func withDropped(line []byte, n uint64) []byte {
	end := len(line) - 1 // the newline
	for end > 0 && line[end] != '}' {
		end--
	}
	if end <= 0 || line[end] != '}' {
		return line // not a JSON object: leave it alone rather than break it
	}
	tail := string(line[end:])
	out := line[:end]
	if out[len(out)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, '"')
	out = append(out, DroppedKey...)
	out = append(out, '"', ':')
	out = strconv.AppendUint(out, n, 10)
	return append(out, tail...)
}

// drop counts a line that was not queued.
func (q *Queue) drop() {
	q.dropped.Add(1)
	q.pending.Add(1)
}

// full reports whether a line logged now would be dropped.
func (q *Queue) full() bool {
	return q.closing.Load() || len(q.lines) == cap(q.lines)
}

// enqueuer is the JSON handler's writer: each Write is one formatted line, copied onto the
// queue if there is room and dropped otherwise. It never blocks.
type enqueuer struct{ q *Queue }

func (e enqueuer) Write(p []byte) (int, error) {
	q := e.q
	if q.full() {
		q.drop()
		return len(p), nil
	}
	b, _ := q.pool.Get().(*[]byte)
	if b == nil {
		b = new([]byte)
	}
	*b = append((*b)[:0], p...)
	q.unwritten.Add(1)
	select {
	case q.lines <- b:
	default:
		q.unwritten.Add(-1)
		q.pool.Put(b)
		q.drop()
	}
	return len(p), nil
}

// Handler is a slog.Handler writing JSON lines, exactly as slog.JSONHandler formats them, through
// a Queue. Handle never blocks on the sink. Safe for concurrent use.
type Handler struct {
	q *Queue
	h *slog.JSONHandler
}

// Enabled reports whether records at level are logged (Config.Options.Level).
func (h *Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.h.Enabled(ctx, level)
}

// Handle formats r and queues the line, or drops and counts it when the queue is full or
// closed. It returns nil: a dropped line is counted, not an error for the caller.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if h.q.full() {
		// Spare the caller the formatting of a line that could not be queued.
		h.q.drop()
		return nil
	}
	return h.h.Handle(ctx, r)
}

// WithAttrs returns a handler adding attrs to every record, feeding the same queue.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Handler{q: h.q, h: h.h.WithAttrs(attrs).(*slog.JSONHandler)}
}

// WithGroup returns a handler putting later attributes in group name, feeding the same queue.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{q: h.q, h: h.h.WithGroup(name).(*slog.JSONHandler)}
}
