/* The bf16 linears of one SmolLM2-135M forward (30 layers of q, k, v, o, gate, up, down, and the 49152-row head)
   for 1-16 query rows, two ways, best of 15: f32fma widens each bfloat16 weight to float32 and FMAs it with the
   float32 activations (the fused step's arithmetic, kernels/cpu_decode.c: exact products), dpbf16 rounds the
   activations to bfloat16 and uses AVX512-BF16's vdpbf16ps (32 products an instruction). Random weights; timing
   only, no numbers compared. Needs a CPU with avx512_bf16:
   cc -O3 -march=native -fopenmp tools/bf16_dot_bench.c -o /tmp/bf16_dot_bench && OMP_NUM_THREADS=2 /tmp/bf16_dot_bench */
#define _GNU_SOURCE
#include <time.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#define RB 4
static inline __m512 wl(const uint16_t *p){return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)),16));}
static void lin_f32(const uint16_t *w,int out,int in,const float *x,float *y,int rows){
#pragma omp parallel for schedule(static)
 for(int o=0;o<out;o+=4){
  const uint16_t *wr[4]; for(int r=0;r<4;r++) wr[r]=w+(int64_t)(o+r)*in;
  for(int m=0;m<rows;m+=RB){ int rb=rows-m<RB?rows-m:RB;
   __m512 a[RB][4]; for(int b=0;b<RB;b++)for(int r=0;r<4;r++)a[b][r]=_mm512_setzero_ps();
   for(int i=0;i+16<=in;i+=16){
     if(m==0) for(int r=0;r<4;r++) __builtin_prefetch(wr[r]+i+256,0,0);
     __m512 w0=wl(wr[0]+i),w1=wl(wr[1]+i),w2=wl(wr[2]+i),w3=wl(wr[3]+i);
     for(int b=0;b<rb;b++){ __m512 xv=_mm512_loadu_ps(x+(m+b)*in+i);
       a[b][0]=_mm512_fmadd_ps(w0,xv,a[b][0]);a[b][1]=_mm512_fmadd_ps(w1,xv,a[b][1]);
       a[b][2]=_mm512_fmadd_ps(w2,xv,a[b][2]);a[b][3]=_mm512_fmadd_ps(w3,xv,a[b][3]);}
   }
   for(int b=0;b<rb;b++)for(int r=0;r<4;r++) y[(m+b)*out+o+r]=_mm512_reduce_add_ps(a[b][r]);
  }}
}
static void lin_dp(const uint16_t *w,int out,int in,const uint16_t *x,float *y,int rows){
#pragma omp parallel for schedule(static)
 for(int o=0;o<out;o+=4){
  const uint16_t *wr[4]; for(int r=0;r<4;r++) wr[r]=w+(int64_t)(o+r)*in;
  for(int m=0;m<rows;m+=RB){ int rb=rows-m<RB?rows-m:RB;
   __m512 a[RB][4]; for(int b=0;b<RB;b++)for(int r=0;r<4;r++)a[b][r]=_mm512_setzero_ps();
   for(int i=0;i+32<=in;i+=32){
     if(m==0) for(int r=0;r<4;r++) __builtin_prefetch(wr[r]+i+256,0,0);
     __m512bh w0=(__m512bh)_mm512_loadu_si512(wr[0]+i),w1=(__m512bh)_mm512_loadu_si512(wr[1]+i),w2=(__m512bh)_mm512_loadu_si512(wr[2]+i),w3=(__m512bh)_mm512_loadu_si512(wr[3]+i);
     for(int b=0;b<rb;b++){ __m512bh xv=(__m512bh)_mm512_loadu_si512(x+(m+b)*in+i);
       a[b][0]=_mm512_dpbf16_ps(a[b][0],w0,xv);a[b][1]=_mm512_dpbf16_ps(a[b][1],w1,xv);
       a[b][2]=_mm512_dpbf16_ps(a[b][2],w2,xv);a[b][3]=_mm512_dpbf16_ps(a[b][3],w3,xv);}
   }
   for(int b=0;b<rb;b++)for(int r=0;r<4;r++) y[(m+b)*out+o+r]=_mm512_reduce_add_ps(a[b][r]);
  }}
}
double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
 int shp[8][2]={{576,576},{192,576},{192,576},{576,576},{1536,576},{1536,576},{576,1536},{0,0}};
 uint16_t *W[31][7]; for(int l=0;l<30;l++)for(int k=0;k<7;k++){size_t n=(size_t)shp[k][0]*shp[k][1];W[l][k]=malloc(n*2);for(size_t i=0;i<n;i++)W[l][k][i]=0x3f80^(rand()&0x3f);}
 uint16_t *H=malloc((size_t)49152*576*2); for(size_t i=0;i<(size_t)49152*576;i++)H[i]=0x3c00^(rand()&0xff);
 float *x=malloc(16*1536*4),*y=malloc(16*49152*4); uint16_t *xb=malloc(16*1536*2);
 for(int i=0;i<16*1536;i++){x[i]=rand()/(float)RAND_MAX;xb[i]=0x3f00|(rand()&0x7f);}
 int RS[]={1,2,4,8,16};
 for(int mode=0;mode<2;mode++) for(int ri=0;ri<5;ri++){int R=RS[ri]; double best=1e9;
  for(int rep=0;rep<15;rep++){double t=now();
   for(int l=0;l<30;l++)for(int k=0;k<7;k++){ if(mode==0) lin_f32(W[l][k],shp[k][0],shp[k][1],x,y,R); else lin_dp(W[l][k],shp[k][0],shp[k][1],xb,y,R);}
   if(mode==0) lin_f32(H,49152,576,x,y,R); else lin_dp(H,49152,576,xb,y,R);
   t=now()-t; if(t<best)best=t;}
  printf("%s R=%d %.2f ms\n",mode?"dpbf16":"f32fma",R,best*1e3);}
}
