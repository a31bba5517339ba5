// SPDX-License-Identifier: MIT
// The Java peer of the memory store's shared hot key: Guava's RateLimiter
// (one limiter, always admitting, as the bench's token bucket) taken by one
// thread and by two at once.  Prints
// the bench's figures, best of ROUNDS spans: "one NS", one thread's ns
// per decision, and "two NS", each of two threads' on the one limiter (2 /
// the pair's decisions per ns), as `ratelimit bench --java-peer` reads them.
//   java -cp guava.jar:. GuavaPeer [ROUNDS] [SPAN_MS]
import com.google.common.util.concurrent.RateLimiter;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.atomic.AtomicBoolean;

public final class GuavaPeer {
    static volatile long sink;

    static double run(RateLimiter lim, int threads, long spanMs) throws Exception {
        AtomicBoolean stop = new AtomicBoolean();
        CyclicBarrier start = new CyclicBarrier(threads + 1);
        long[] counts = new long[threads];
        Thread[] th = new Thread[threads];
        for (int i = 0; i < threads; i++) {
            final int me = i;
            th[i] = new Thread(() -> {
                long n = 0, ok = 0;
                try { start.await(); } catch (Exception e) { return; }
                while (!stop.get()) {
                    if (lim.tryAcquire()) ok++;
                    n++;
                }
                counts[me] = n;
                sink += ok;
            });
            th[i].start();
        }
        start.await();
        long t0 = System.nanoTime();
        Thread.sleep(spanMs);
        stop.set(true);
        long total = 0;
        for (int i = 0; i < threads; i++) {
            th[i].join();
            total += counts[i];
        }
        long dt = System.nanoTime() - t0;
        return (double) total / dt; // decisions per ns
    }

    public static void main(String[] args) throws Exception {
        int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 5;
        long span = args.length > 1 ? Long.parseLong(args[1]) : 200;
        RateLimiter lim = RateLimiter.create(1e9);
        run(lim, 1, 1000); // warm the JIT
        run(lim, 2, 1000);
        double one = 0, two = 0;
        for (int r = 0; r < rounds; r++) {
            one = Math.max(one, run(lim, 1, span));
            two = Math.max(two, run(lim, 2, span));
        }
        System.out.printf("one %.2f%n", 1 / one);
        System.out.printf("two %.2f%n", 2 / two);
    }
}
