package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/internal/idgen"
	fspb "github.com/corralhq/corral/proto/filesystem"
)

const (
	// maxWatchers bounds CreateWatcher watchers alive at once.
	maxWatchers = 128
	// maxPendingEvents bounds the events a CreateWatcher watcher keeps
	// until GetWatcherEvents; older ones are dropped beyond it.
	maxPendingEvents = 4096
	// watchBuffer bounds the events queued for a WatchDir stream; when
	// full the watcher blocks (and the kernel queue absorbs or overflows).
	watchBuffer = 256
)

// dirWatch is an fsnotify watch of a directory (recursively if asked)
// that produces FilesystemEvents with names relative to the root.
type dirWatch struct {
	root         string
	recursive    bool
	includeEntry bool
	w            *fsnotify.Watcher
	db           *userDB
	events       chan *fspb.FilesystemEvent
	done         chan struct{}
	closeOnce    sync.Once
}

// network filesystem magic numbers refused without allowNetworkMounts.
var networkFS = map[uint32]bool{
	0x6969:     true, // NFS
	0x517B:     true, // SMB
	0xFF534D42: true, // CIFS
	0xFE534D42: true, // SMB2
}

// newDirWatch validates root and starts watching it.
func newDirWatch(root string, recursive, includeEntry, allowNetwork bool, db *userDB) (*dirWatch, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err, root)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", root))
	}
	if !allowNetwork {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err == nil && networkFS[uint32(st.Type)] {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is on a network mount", root))
		}
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	dw := &dirWatch{root: root, recursive: recursive, includeEntry: includeEntry, w: w, db: db,
		events: make(chan *fspb.FilesystemEvent, watchBuffer), done: make(chan struct{})}
	if err := dw.add(root); err != nil {
		w.Close()
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	go dw.run()
	return dw, nil
}

// add watches dir and, when recursive, every directory below it.
func (dw *dirWatch) add(dir string) error {
	if !dw.recursive {
		return dw.w.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil
		}
		if d.IsDir() {
			if err := dw.w.Add(p); err != nil && p == dir {
				return err
			}
		}
		return nil
	})
}

func (dw *dirWatch) close() {
	dw.closeOnce.Do(func() {
		close(dw.done)
		dw.w.Close()
	})
}

var opTypes = []struct {
	op fsnotify.Op
	t  fspb.EventType
}{
	{fsnotify.Create, fspb.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Write, fspb.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, fspb.EventType_EVENT_TYPE_REMOVE},
	{fsnotify.Rename, fspb.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, fspb.EventType_EVENT_TYPE_CHMOD},
}

func (dw *dirWatch) run() {
	defer close(dw.events)
	for {
		select {
		case <-dw.done:
			return
		case ev, ok := <-dw.w.Events:
			if !ok {
				return
			}
			if dw.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					_ = dw.add(ev.Name)
				}
			}
			rel, err := filepath.Rel(dw.root, ev.Name)
			if err != nil {
				continue
			}
			// One inotify event with several ops yields one message per op.
			for _, ot := range opTypes {
				if !ev.Has(ot.op) {
					continue
				}
				fe := &fspb.FilesystemEvent{Name: rel, Type: ot.t}
				if dw.includeEntry && (ot.op == fsnotify.Create || ot.op == fsnotify.Write || ot.op == fsnotify.Chmod) {
					if e, err := entryInfo(ev.Name, ev.Name, dw.db); err == nil {
						fe.Entry = e
					}
				}
				select {
				case dw.events <- fe:
				case <-dw.done:
					return
				}
			}
		case _, ok := <-dw.w.Errors:
			if !ok {
				return
			}
		}
	}
}

// WatchDir streams filesystem events under a directory: {"start":{}} first,
// then events and keepalives until the client goes away.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	u, db, err := f.s.rpcUser(req.Header())
	if err != nil {
		return err
	}
	p, err := rpcPath(req.Msg.GetPath(), u)
	if err != nil {
		return err
	}
	dw, err := newDirWatch(p, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts(), db)
	if err != nil {
		return err
	}
	defer dw.close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keepalive := keepaliveInterval(req.Header())
	ka := time.NewTimer(keepalive)
	defer ka.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil // the watch's requested duration is over
			}
			return ctx.Err()
		case ev, ok := <-dw.events:
			if !ok {
				return connect.NewError(connect.CodeInternal, errors.New("watcher stopped"))
			}
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
			ka.Reset(keepalive)
		case <-ka.C:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			ka.Reset(keepalive)
		}
	}
}

// polledWatcher is a CreateWatcher watcher: events accumulate (bounded)
// until GetWatcherEvents collects them.
type polledWatcher struct {
	dw      *dirWatch
	mu      sync.Mutex
	pending []*fspb.FilesystemEvent
}

// watcherTable holds CreateWatcher watchers by id.
type watcherTable struct {
	mu sync.Mutex
	m  map[string]*polledWatcher
}

func newWatcherTable() *watcherTable { return &watcherTable{m: map[string]*polledWatcher{}} }

// CreateWatcher starts a watcher whose events are fetched with
// GetWatcherEvents.
func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	u, db, err := f.s.rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p, err := rpcPath(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	t := f.s.watchers
	t.mu.Lock()
	n := len(t.m)
	t.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("too many watchers (%d)", maxWatchers))
	}
	dw, err := newDirWatch(p, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts(), db)
	if err != nil {
		return nil, err
	}
	id := idgen.Hex(12)
	pw := &polledWatcher{dw: dw}
	t.mu.Lock()
	t.m[id] = pw
	t.mu.Unlock()
	go func() {
		for ev := range dw.events {
			pw.mu.Lock()
			if len(pw.pending) >= maxPendingEvents {
				pw.pending = pw.pending[1:]
			}
			pw.pending = append(pw.pending, ev)
			pw.mu.Unlock()
		}
	}()
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (t *watcherTable) get(id string) (*polledWatcher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pw, ok := t.m[id]; ok {
		return pw, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher with id %s not found", id))
}

// GetWatcherEvents returns and clears a watcher's pending events.
func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	pw, err := f.s.watchers.get(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	pw.mu.Lock()
	evs := pw.pending
	pw.pending = nil
	pw.mu.Unlock()
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: evs}), nil
}

// RemoveWatcher stops a watcher.
func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	t := f.s.watchers
	t.mu.Lock()
	pw, ok := t.m[req.Msg.GetWatcherId()]
	delete(t.m, req.Msg.GetWatcherId())
	t.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher with id %s not found", req.Msg.GetWatcherId()))
	}
	pw.dw.close()
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
